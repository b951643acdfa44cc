// defines: CpuBackend::cast: dtype conversion between fp32 and the 16-bit storage types (bf16,
// fp16; round to nearest, ties to even, as runtime/tensor.h), used to write the low-precision
// weights from the fp32 master copy.
#include <cstring>
#include <string>

#include "core/error.h"
#include "runtime/cpu/cpu_backend.h"
#include "runtime/tensor.h"

namespace parasol::runtime {

void CpuBackend::cast(void* dst, Dtype dst_type, const void* src, Dtype src_type, int64_t n) {
  const auto unsupported = [&] {
    return Error("runtime.cast", std::string("unsupported conversion ") + dtype_name(src_type) +
                                     " -> " + dtype_name(dst_type));
  };
  if (src_type == Dtype::kFp32) {
    const auto* s = static_cast<const float*>(src);
    switch (dst_type) {
      case Dtype::kFp32:
        if (dst != src) std::memmove(dst, src, sizeof(float) * n);
        return;
      case Dtype::kBf16: {
        auto* d = static_cast<uint16_t*>(dst);
        for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_bf16(s[i]);
        return;
      }
      case Dtype::kFp16: {
        auto* d = static_cast<uint16_t*>(dst);
        for (int64_t i = 0; i < n; ++i) d[i] = fp32_to_fp16(s[i]);
        return;
      }
      default:
        throw unsupported();
    }
  }
  if (dst_type != Dtype::kFp32) throw unsupported();
  auto* d = static_cast<float*>(dst);
  const auto* s = static_cast<const uint16_t*>(src);
  switch (src_type) {
    case Dtype::kBf16:
      for (int64_t i = 0; i < n; ++i) d[i] = bf16_to_fp32(s[i]);
      return;
    case Dtype::kFp16:
      for (int64_t i = 0; i < n; ++i) d[i] = fp16_to_fp32(s[i]);
      return;
    default:
      throw unsupported();
  }
}

}  // namespace parasol::runtime
