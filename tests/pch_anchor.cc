// The source of parasol_test_pch (tests/CMakeLists.txt), the target that builds the precompiled
// header every GoogleTest suite reuses; it has no code of its own.
