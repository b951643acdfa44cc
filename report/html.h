// HTML helpers of the report: escaping text for HTML and embedding JSON in a <script> block.
#pragma once

#include <string>

#include "core/json_reader.h"

namespace parasol::report {

// `text` with &, <, >, " and ' replaced by their character references: safe as element text and
// as a quoted attribute value.
std::string html_escape(const std::string& text);

// `j` serialised for a <script type="application/json"> block: compact JSON in which every <, >
// and & (they occur only inside strings) is written as a \u escape, so no string can close the
// block ("</script>") or open a comment; JSON.parse of the block's text gives `j` back.
std::string json_for_script(const Json& j);

}  // namespace parasol::report
