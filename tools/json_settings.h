// Command-line settings of JSON documents: "KEY=VALUE" sets a field, "KEY*=FACTOR" scales every
// number under it. `parasol accuracy --profile-set/--plan-set` use them to measure what each
// term of the cost model does to the published runs (tools/term-effects.sh).
//
// KEY is a top-level key ("sustained_clock") or a '/'-separated path into nested objects and
// arrays ("nccl/net_overhead_us", "link_efficiency/nvlink"). VALUE is JSON when it parses as
// JSON (0.5, true, [1,2], {"a":1}) and a string otherwise (cudnn). Scaling multiplies every
// number in the subtree at KEY (a table of latencies at once) and leaves the rest alone.
#pragma once

#include <string>
#include <vector>

#include "core/json_reader.h"

namespace parasol::tools {

// Applies the settings in order. Throws parasol::Error naming `field` (the flag) on a setting
// without '=', an empty key, a path through a non-container, a scale of a key that does not
// exist or a factor that is not a number.
Json with_settings(Json doc, const std::vector<std::string>& settings, const std::string& field);

}  // namespace parasol::tools
