// core/error.h: the three kinds of failure, their exit codes and printed lines, and PARASOL_CHECK
// (the condition's text, the message and the source place in what()).
#include "core/error.h"

#include <gtest/gtest.h>

#include <string>

namespace parasol {
namespace {

TEST(Error, CheckNamesTheConditionAndThePlace) {
  try {
    PARASOL_CHECK(1 + 1 == 3, "arithmetic");
    FAIL() << "PARASOL_CHECK did not throw";
  } catch (const InternalError& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInternal);
    EXPECT_NE(std::string(e.what()).find("`1 + 1 == 3`"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("tests/core/error_test.cc:"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("arithmetic"), std::string::npos) << e.what();
    EXPECT_EQ(exit_code(e.kind()), 1);
  }
  EXPECT_NO_THROW(PARASOL_CHECK(1 + 1 == 2, "arithmetic"));
  EXPECT_EQ(exit_code(ErrorKind::kUser), 2);
  EXPECT_EQ(exit_code(ErrorKind::kSystem), 1);
  EXPECT_EQ(error_line(SystemError("write", "disk full")), "system error: write: disk full");
  EXPECT_EQ(error_line(Error("plan.tp", "must be >= 1")), "error: plan.tp: must be >= 1");
}

TEST(Error, KindsAndTheirTypes) {
  const Error user("plan.tp", "must be >= 1");
  EXPECT_TRUE(user.is_user_error());
  EXPECT_EQ(user.field(), "plan.tp");
  EXPECT_EQ(std::string(user.what()), "plan.tp: must be >= 1");
  const InternalError bug("core/lower.cc:12", "check `x` failed");
  EXPECT_EQ(bug.kind(), ErrorKind::kInternal);
  EXPECT_FALSE(bug.is_user_error());
  EXPECT_EQ(error_line(bug),
            "internal error (this is a parasol bug; please report it): core/lower.cc:12: check "
            "`x` failed");
  const SystemError sys("MPI_Allreduce", "MPI_ERR_TRUNCATE");
  EXPECT_EQ(sys.kind(), ErrorKind::kSystem);
  // Copied as an Error (the runtime's cross-rank agreement stores one), the kind stays.
  const Error copy = sys;
  EXPECT_EQ(copy.kind(), ErrorKind::kSystem);
  EXPECT_EQ(exit_code(copy.kind()), 1);
}

}  // namespace
}  // namespace parasol
