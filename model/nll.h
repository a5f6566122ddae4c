// Token negative log-likelihood for supervised fine-tuning (SFT warm starts, tests): the loss and
// the dL/dlogprob that the training backward (engine/train_step.h train_backward) takes.
#pragma once

#include "model/model.h"

namespace fp8rl::model {

// loss = -sum_{s,i} w[s][i] * logprobs[s][i] / sum w (w = 1 everywhere when weights is null);
// fills dlogp (same shape) with dloss/dlogprob. Returns the loss (0 when sum w is 0).
double token_nll(const TokenValues& logprobs, const TokenValues* weights, TokenValues* dlogp);

}  // namespace fp8rl::model
