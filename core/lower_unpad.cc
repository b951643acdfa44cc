// The unpadded attention of Plan::attention_unpad: llm-foundry's MPT under attn_impl flash
// (llmfoundry/models/layers/attention.py flash_attn_fn @5e85bd62d) unpads Q, K and V into packed
// rows before flash-attn's variable-length kernel and pads its output back, with flash-attn's
// bert_padding helpers (flash_attn/bert_padding.py, flash-attn 2.4.2):
//  - unpad_input(x, mask), once for each of Q, K and V: the mask's row lengths (sum), the kept
//    rows' indices (torch.nonzero: a device-to-host sync for its count), the longest row
//    (.max().item(): a second sync), cu_seqlens (cumsum, F.pad), then index_first_axis, a gather
//    of the rows (torch.gather with a broadcast index: the rows read and written once);
//  - pad_input(out, ...): index_put_first_axis, a zeroed output and the rows put into it;
//  - backward: pad_input's gradient gathers the rows of dO (grad_output[indices]); each
//    index_first_axis's gradient scatters dQ, dK, dV into zeroed full-size gradients; and the
//    three gradients are concatenated into the fused QKV projection's gradient (the backward of
//    MPT's qkv.chunk(3, dim=2), a cat).
// Every mask is all ones in pre-training (no padding), so every row is kept: each copy moves the
// whole tensor.
#include "core/lower_internal.h"

namespace parasol::lowering {

namespace {
struct Part {
  const char* name;
  int64_t cols;
};
}  // namespace

std::vector<int> Lowerer::unpad_qkv(int layer, int qkv) {
  static constexpr const char* kLen[] = {"unpad.q.len", "unpad.k.len", "unpad.v.len"};
  static constexpr const char* kNz[] = {"unpad.q.nonzero", "unpad.k.nonzero", "unpad.v.nonzero"};
  static constexpr const char* kMax[] = {"unpad.q.max", "unpad.k.max", "unpad.v.max"};
  static constexpr const char* kItem[] = {"unpad.q.item", "unpad.k.item", "unpad.v.item"};
  static constexpr const char* kCu[] = {"unpad.q.cumsum", "unpad.k.cumsum", "unpad.v.cumsum"};
  static constexpr const char* kPad[] = {"unpad.q.cu", "unpad.k.cu", "unpad.v.cu"};
  const Part parts[3] = {{"unpad.q", q_cols_}, {"unpad.k", k_cols_}, {"unpad.v", v_cols_}};
  const double rows = double(T_);
  std::vector<int> out;
  for (int i = 0; i < 3; ++i) {
    // The row lengths of the (boolean) mask, the kept rows' int64 indices, the longest row.
    const int lens = ws(layer, kLen[i], {p_.micro_batch}, Dtype::kFp32);
    elementwise(OpKind::kResidualAdd, layer, kLen[i], rows, rows + 4.0 * p_.micro_batch, {},
                {lens});
    const int idx = ws(layer, kNz[i], {T_, 2}, Dtype::kFp32);
    const int nz = elementwise(OpKind::kResidualAdd, layer, kNz[i], rows, 9 * rows, {}, {idx});
    host_sync(kNz[i], {nz});
    const int longest = ws(layer, kMax[i], {1}, Dtype::kFp32);
    const int mx = elementwise(OpKind::kResidualAdd, layer, kMax[i], double(p_.micro_batch),
                               4.0 * p_.micro_batch, {lens}, {longest});
    host_sync(kItem[i], {mx});
    const int cu = ws(layer, kCu[i], {p_.micro_batch + 1}, Dtype::kFp32);
    elementwise(OpKind::kResidualAdd, layer, kCu[i], double(p_.micro_batch), 8.0 * p_.micro_batch,
                {lens}, {cu});
    elementwise(OpKind::kResidualAdd, layer, kPad[i], double(p_.micro_batch), 8.0 * p_.micro_batch,
                {cu}, {cu});
    // index_first_axis: the rows gathered into a packed copy.
    const int packed = ws(layer, parts[i].name, {T_, parts[i].cols});
    elementwise(OpKind::kResidualAdd, layer, parts[i].name, rows * parts[i].cols,
                2 * eb_ * rows * parts[i].cols, {qkv, idx}, {packed});
    out.push_back(packed);
  }
  return out;
}

void Lowerer::pad_output(int layer, int out) {
  const double n = double(T_) * ao_cols_;
  // index_put_first_axis: torch.zeros of the padded output, then output[indices] = values.
  elementwise(OpKind::kResidualAdd, layer, "pad.zeros", n, eb_ * n, {}, {out});
  elementwise(OpKind::kResidualAdd, layer, "pad", n, 2 * eb_ * n, {out}, {out});
}

int Lowerer::unpad_dout(int layer, int dao) {
  const double n = double(T_) * ao_cols_;
  const int packed = ws(layer, "pad.bwd", {T_, ao_cols_});
  elementwise(OpKind::kResidualAdd, layer, "pad.bwd", n, 2 * eb_ * n, {dao}, {packed});
  return packed;
}

void Lowerer::pad_qkv_grad(int layer, int dqkv) {
  static constexpr const char* kZeros[] = {"unpad.q.bwd.zeros", "unpad.k.bwd.zeros",
                                           "unpad.v.bwd.zeros"};
  static constexpr const char* kScatter[] = {"unpad.q.bwd", "unpad.k.bwd", "unpad.v.bwd"};
  const int64_t cols[3] = {q_cols_, k_cols_, v_cols_};
  const double rows = double(T_);
  for (int i = 0; i < 3; ++i) {
    const double n = rows * cols[i];
    elementwise(OpKind::kResidualAdd, layer, kZeros[i], n, eb_ * n, {dqkv}, {dqkv});
    elementwise(OpKind::kResidualAdd, layer, kScatter[i], n, 2 * eb_ * n, {dqkv}, {dqkv});
  }
  const double all = rows * qkv_cols_;
  elementwise(OpKind::kResidualAdd, layer, "qkv.cat", all, 2 * eb_ * all, {dqkv}, {dqkv});
}

}  // namespace parasol::lowering
