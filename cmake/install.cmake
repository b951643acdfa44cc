# `cmake --install`: the parasol executable, the libraries, their headers and a CMake package, so
# that another project's `find_package(parasol CONFIG REQUIRED)` gives it parasol::parasol_core,
# parasol::parasol_cost_models, parasol::parasol_sim, ... (and a pkg-config file, parasol.pc).
# Included at the end of the top-level CMakeLists.txt, after every library target exists.
#
# Layout under the prefix:
#   bin/parasol
#   include/parasol/{core,cost_models,traces,sim,interop,runtime}/...h   (#include "core/model.h")
#   lib/libparasol_*.a                     (static, as the project builds them)
#   lib/cmake/parasol/parasol{Config,ConfigVersion,Targets}.cmake
#   lib/pkgconfig/parasol.pc
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(PARASOL_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/parasol")
set(PARASOL_INSTALL_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}/parasol")

# The libraries, in floor order, that exist in this configuration (interop/ is new; the CUDA
# ones only where the CUDA parts are built). parasol_openblas is the interface target that
# runtime/ makes of Debian's OpenBLAS when the OpenBLAS package has no imported target: the
# static runtime libraries link it, so it is exported with them.
set(_parasol_libraries)
foreach(_t parasol_core parasol_interop parasol_cost_models parasol_traces parasol_sim
           parasol_runtime parasol_runtime_state parasol_runtime_comm_base parasol_runtime_comm
           parasol_runtime_exec parasol_runtime_cuda parasol_runtime_nccl parasol_openblas)
  if(TARGET ${_t})
    list(APPEND _parasol_libraries ${_t})
  endif()
endforeach()

# In the build tree the top-level include_directories() finds the headers; installed, a
# consumer finds them under include/parasol through each library's interface.
foreach(_t IN LISTS _parasol_libraries)
  get_target_property(_type ${_t} TYPE)
  if(NOT _type STREQUAL "INTERFACE_LIBRARY")
    target_include_directories(${_t} INTERFACE
                               $<INSTALL_INTERFACE:${PARASOL_INSTALL_INCLUDEDIR}>)
  endif()
endforeach()

install(TARGETS ${_parasol_libraries} parasol
        EXPORT parasolTargets
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})

# The public headers with their folder layout (runtime's subfolders cpu/, comm/, cuda/ too).
foreach(_dir core cost_models traces sim interop runtime)
  if(IS_DIRECTORY ${PROJECT_SOURCE_DIR}/${_dir})
    install(DIRECTORY ${PROJECT_SOURCE_DIR}/${_dir}/
            DESTINATION ${PARASOL_INSTALL_INCLUDEDIR}/${_dir}
            FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")
  endif()
endforeach()

install(EXPORT parasolTargets
        NAMESPACE parasol::
        DESTINATION ${PARASOL_INSTALL_CMAKEDIR})

# What parasolConfig.cmake must find again for the exported link interfaces.
set(PARASOL_EXPORT_HAVE_CUDA ${PARASOL_HAVE_CUDA})
set(PARASOL_EXPORT_OPENBLAS_CONFIG OFF)
if(TARGET OpenBLAS::OpenBLAS)
  set(PARASOL_EXPORT_OPENBLAS_CONFIG ON)
endif()
configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/parasolConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/parasolConfig.cmake
  INSTALL_DESTINATION ${PARASOL_INSTALL_CMAKEDIR})
write_basic_package_version_file(
  ${CMAKE_CURRENT_BINARY_DIR}/parasolConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/parasolConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/parasolConfigVersion.cmake
        DESTINATION ${PARASOL_INSTALL_CMAKEDIR})

# pkg-config: the predicting libraries (core to sim), for builds without CMake.
# Relocatable: the prefix is found from the .pc file's own folder (pkg-config's pcfiledir).
file(RELATIVE_PATH PARASOL_PC_PREFIX "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
configure_file(${CMAKE_CURRENT_LIST_DIR}/parasol.pc.in ${CMAKE_CURRENT_BINARY_DIR}/parasol.pc
               @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/parasol.pc
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
