// Invariants of what parasol's readers return: a document that was read must describe a valid
// object (its counts positive, its round trip stable). Shared by the seeded-mutation unit test
// (tests/core/json_fuzz_test.cc) and the coverage-guided fuzz targets of this folder; each
// check throws std::logic_error, never parasol::Error, so that a reader that accepts what it
// should have rejected is a failure, not a clean rejection.
#pragma once

#include "core/cluster.h"
#include "core/model.h"
#include "core/plan.h"
#include "cost_models/profile.h"
#include "traces/kineto_import.h"
#include "traces/trace.h"

namespace parasol::fuzz {

// validate_model passes, parameter counts and FLOPs per token are positive and finite.
void check_model(const Model& m);
// At least one GPU, server and GPU per server; every pair of the first 16 GPUs has a usable
// path; the explicit-graph JSON reads back to the same GPU count.
void check_cluster(const Cluster& c);
// Every degree in range and the JSON round trip stable; validate() against a small MoE model on
// 8 H100s either passes or throws parasol::Error.
void check_plan(const Plan& p);
// Durations non-negative and finite, ranks and streams non-negative; the written trace reads
// back with the same events, counters and flows.
void check_trace(const traces::Trace& t);
// One shape per event, the kinds' counts sum to the events, every unclassified kernel named and
// counted, gaps within the rank's span; then check_trace of the imported trace.
void check_kineto_import(const traces::ImportedTrace& imp);
// Every efficiency in (0, 1] or 0 where optional, every figure finite; the JSON round trip is
// stable.
void check_profile(const cost::Profile& p);

}  // namespace parasol::fuzz
