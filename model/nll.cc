// Weighted mean token NLL and its gradient.
#include "model/nll.h"

namespace fp8rl::model {

double token_nll(const TokenValues& logprobs, const TokenValues* weights, TokenValues* dlogp) {
  double total_w = 0, loss = 0;
  for (size_t s = 0; s < logprobs.size(); ++s) {
    for (size_t i = 0; i < logprobs[s].size(); ++i) {
      const double w = weights ? (*weights)[s][i] : 1.0;
      total_w += w;
      loss -= w * logprobs[s][i];
    }
  }
  dlogp->resize(logprobs.size());
  for (size_t s = 0; s < logprobs.size(); ++s) {
    (*dlogp)[s].assign(logprobs[s].size(), 0.0f);
    if (total_w <= 0) continue;
    for (size_t i = 0; i < logprobs[s].size(); ++i) {
      const double w = weights ? (*weights)[s][i] : 1.0;
      (*dlogp)[s][i] = static_cast<float>(-w / total_w);
    }
  }
  return total_w > 0 ? loss / total_w : 0.0;
}

}  // namespace fp8rl::model
