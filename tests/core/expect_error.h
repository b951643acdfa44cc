// Test helper: runs a callable that must throw a user error (parasol::Error of kind kUser) and
// checks the error's field and a substring of its message.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace parasol {

template <typename Fn>
void ExpectError(Fn fn, const std::string& field, const std::string& substring) {
  try {
    fn();
    ADD_FAILURE() << "expected parasol::Error naming " << field;
  } catch (const Error& e) {
    EXPECT_TRUE(e.is_user_error()) << "not a user error: " << error_line(e);
    EXPECT_EQ(e.field(), field) << e.what();
    EXPECT_NE(std::string(e.what()).find(substring), std::string::npos)
        << "'" << e.what() << "' lacks '" << substring << "'";
  }
}

}  // namespace parasol
