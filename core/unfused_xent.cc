// Megatron-Core's unfused vocab-parallel cross entropy, kernel by kernel (unfused_xent.h).
#include "core/unfused_xent.h"

namespace parasol {

std::vector<XentKernel> unfused_xent_kernels(Phase phase, double eb) {
  using S = XentStandsFor;
  std::vector<XentKernel> k;
  if (phase == Phase::kForward) {
    if (eb != 4) k.push_back({"upcast", eb + 4, 0});  // .float(): the fp32 copy
    k.push_back({"max", 4, 4 + 8, true, S::kMax});    // torch.max(dim=-1): values, indices
    k.push_back({"shift", 8, 4});                     // -= logits_max, in place
    k.push_back({"mask.lo", 0, 8 + 1});               // target < vocab_start_index
    k.push_back({"mask.hi", 0, 8 + 1});               // target >= vocab_end_index
    k.push_back({"mask.or", 0, 3});                   // |
    k.push_back({"target.clone", 0, 16});             // target.clone()
    k.push_back({"target.sub", 0, 16});               // - vocab_start_index
    k.push_back({"target.fill", 0, 1 + 8});           // masked_target[target_mask] = 0
    k.push_back({"arange", 0, 8});                    // torch.arange
    k.push_back({"gather", 0, 8 + 8 + 4 + 4});        // logits_2d[arange_1d, masked_target_1d]
    k.push_back({"gather.clone", 0, 8});              // .clone().contiguous()
    k.push_back({"predicted.fill", 0, 1 + 4});        // predicted_logits[target_mask] = 0.0
    k.push_back({"exp", 8, 0});                       // torch.exp(out=), in place
    k.push_back({"sum", 4, 4, true, S::kSums});       // exp_logits.sum(dim=-1)
    k.push_back({"log", 0, 8});                       // torch.log(sum_exp_logits)
    k.push_back({"loss", 0, 12});                     // - predicted_logits
    k.push_back({"div", 8, 4});                       // exp_logits.div_(sum): the softmax
    return k;
  }
  k.push_back({"mask.float", 0, 1 + 4});         // target_mask.view(-1).float()
  k.push_back({"update", 0, 8});                 // 1.0 - ...
  k.push_back({"arange", 0, 8});                 // torch.arange
  k.push_back({"gather", 0, 8 + 8 + 4 + 4});     // grad_2d[arange, masked_target]
  k.push_back({"sub", 0, 12});                   // -= softmax_update
  k.push_back({"index_put", 0, 8 + 8 + 4 + 4});  // written back (index_put_)
  if (eb == 4) {  // fp32 logits: the engine converts nothing; the mul_ writes the gradient
    k.push_back({"scale", 8, 4, true, S::kGradient});
    return k;
  }
  k.push_back({"scale", 8, 4});                               // grad_input.mul_(grad_output)
  k.push_back({"downcast", 4 + eb, 0, false, S::kGradient});  // the engine's cast to eb
  return k;
}

}  // namespace parasol
