"""Why each wrong letter of a multiple-choice question is wrong, in one sentence.

The grader's feedback for a wrong choice says which letter was chosen and why that statement
fails (never which letter is right). :func:`klbook_grader.hidden.bank.questions` attaches
these to the questions; ``tests/grader/test_exercise_traps.py`` checks that every wrong letter of every
choice question has its sentence.
"""
from __future__ import annotations

EXPLAIN: dict[tuple[str, str], dict[str, str]] = {
    ("ex01_kl_definition", "q4"): {
        "A": "KL is not symmetric even on a common support: P = (0.5, 0.5), Q = (0.9, 0.1) gives 0.511 one way and 0.368 the other.",
        "B": "KL has no such bound: it grows without limit as Q(x) -> 0 where P(x) > 0 (log n bounds the entropy, not the divergence).",
        "D": "KL is not a metric and breaks the triangle inequality (take three Bernoulli distributions 0.1, 0.5, 0.9).",
    },
    ("ex02_forward_reverse", "q1"): {
        "A": "The forward KL averages log(p/q) under p, so it pays dearly wherever p has mass and q does not: it covers both modes.",
        "C": "Far-apart modes make the two directions differ most: one covers both modes, the other locks onto one.",
        "D": "Only the forward KL matches moments (mean and variance); the reverse KL is pulled onto a mode.",
    },
    ("ex02_forward_reverse", "q4"): {
        "B": "Being estimable from the policy's rollouts is true of the reverse KL, but it is mode seeking: it lets the policy drop the expert's other ways.",
        "C": "The reverse KL is infinite where the policy puts mass the expert does not, not where the policy misses the expert's actions.",
        "D": "With a restricted model family the two minimisers differ (mode covering vs mode seeking), even though both vanish at pi_theta = pi_E.",
    },
    ("ex03_trpo_ppo", "q4"): {
        "A": "For A_t > 0 and r_t > 1 + eps the minimum picks the clipped term (1 + eps) A_t, not r_t A_t.",
        "C": "The clip does not reverse the gradient: beyond the range the selected term is a constant in r_t.",
        "D": "(1 + eps) A_t is the value of the clipped term there, not its slope: a constant has slope 0.",
    },
    ("ex03_trpo_ppo", "q5"): {
        "B": "A bound on each ratio is the idea of PPO's clipping, not TRPO's constraint, which is a KL divergence.",
        "C": "TRPO's constraint has pi_old first: the expectation is over the old policy's action distribution.",
        "D": "TRPO constrains the step from the previous policy, not the distance to a frozen reference (that is RLHF's penalty).",
    },
    ("ex04_estimating_kl", "q4"): {
        "B": "k3 = (r - 1) - log r is never negative, since log r <= r - 1 for every r > 0.",
        "C": "k2 = (log r)^2 / 2 is a square: its bias does not make a single value negative.",
        "D": "An estimator of a non-negative quantity can still be negative on one sample: k1 = -log r is, whenever r > 1.",
    },
    ("ex04_estimating_kl", "q5"): {
        "A": "The expected gradient of k1 used as a loss is 0: E_pi[grad log pi] = 0, whatever KL its value estimates.",
        "B": "The expected gradient of k2 as a loss is the gradient of the reverse KL, not of the forward one.",
        "D": "One of the estimators does give it: its expected gradient works out to the gradient of KL(pi_ref || pi_theta).",
    },
    ("ex05_kl_in_practice", "q3"): {
        "B": "A target is not what changed at update 201: a 50-fold jump after 200 steady updates points at that update, not at the setting.",
        "C": "A jump of the mean from 0.01 to 0.5 together with a falling return is a real change of the policy, not an outlier to hide with a median.",
        "D": "Two hundred updates near 0.01 show the noise level: 0.5 is far outside it, and the return dropped with it.",
    },
    ("ex05_kl_in_practice", "q4"): {
        "A": "For samples from pi_theta the mean of log pi_theta - log pi_ref estimates a KL, which is never negative whatever the distance.",
        "B": "k1's mean is unbiased for samples from pi_theta at any length; a negative mean means the samples did not come from pi_theta.",
        "C": "No beta can make KL(pi_theta || pi_ref) negative: there is no 'other side' of the reference.",
    },
    ("ex06_rlhf_reverse_kl", "q3"): {
        "A": "That is a reason: the reverse KL is an expectation under pi_theta, estimable from the responses the policy generates.",
        "B": "That is a reason (or at least an accepted property): mode seeking lets the policy concentrate on good responses the reference supports.",
        "C": "That is a reason: the unbounded penalty for text the reference would not write keeps the policy where the reward model is trustworthy.",
    },
    ("ex06_rlhf_reverse_kl", "q4"): {
        "A": "Nothing keeps the policy near the reference but the penalty: with beta far too small the reward model's gradient wins.",
        "C": "The reverse KL of the policy's own samples does not turn negative, and a controller raises beta when the KL grows.",
        "D": "Removing the constraint makes training less stable: the policy drifts to where the reward model is wrong.",
    },
    ("ex07_token_level_kl", "q4"): {
        "B": "The sum over one sampled response is a random quantity; only its expectation is the sequence-level KL.",
        "C": "By the chain rule the summed per-token log-ratios of a response sampled from pi_theta have exactly the sequence KL as expectation, at any length.",
        "D": "The tokens are sampled from pi_theta, so the sum estimates KL(pi_theta || pi_ref), the reverse direction.",
    },
    ("ex08_vi_elbo_dpo", "q4"): {
        "B": "log p(x) - ELBO(q) is an expectation under q, so the divergence it equals has q first.",
        "C": "KL(q(z) || p(z)) is a term inside the ELBO, not the gap between log p(x) and the ELBO.",
        "D": "p(x, z) is not normalised over z; the gap is a KL to the normalised posterior p(z | x).",
    },
    ("ex09_choosing_beta", "q4"): {
        "B": "A KL above target means the penalty is too weak, so the controller makes it stronger.",
        "C": "The usual dead band is [target / 1.5, 1.5 x target]; above it the controller acts.",
        "D": "An adaptive controller moves beta from where it is (multiplicatively or proportionally), it does not reset it.",
    },
    ("ex10_other_divergences", "q4"): {
        "A": "KL(p || q) is infinite: p has mass where q is 0, and each such term is p log(p / 0).",
        "B": "Each direction evaluates the log-ratio where its first argument has mass, and there the other argument is 0: both are infinite.",
        "D": "Bounded divergences stay finite on disjoint supports: Jensen-Shannon is then log 2 and total variation 1.",
    },
    ("ex11_sequence_kl_grpo", "q4"): {
        "A": "k3 in the loss has, at each token, the expected gradient of the forward KL at that prefix, and the per-response mean reweights it: not the sequence KL's gradient.",
        "B": "k2 in the loss has the per-token reverse-KL gradient but misses the effect of a token on the later positions' KL.",
        "D": "k1 in the loss has expected gradient 0 (the score function has mean 0).",
    },
    ("ex11_sequence_kl_grpo", "q6"): {
        "B": "Dividing by a constant scales every token's term alike: the gradient keeps its direction.",
        "C": "Dividing by the total number of tokens is one number per batch, so in a large batch it only rescales the gradient.",
        "D": "One normalisation weights each response's tokens by 1 / its own length, and that reweighting turns the gradient.",
    },
    ("ex12_overoptimisation_distillation", "q5"): {
        "A": "The reverse KL is minimised (at 0) by the teacher itself; the student stopped elsewhere for another reason.",
        "C": "The forward KL on teacher samples charges the student for every teacher token it fails to predict, so stopping at once is expensive there.",
        "D": "The exact gradient itself leads there: charging each token for the KL of the prefixes it opens pushes towards stopping early.",
    },
    ("ex12_overoptimisation_distillation", "q6"): {
        "A": "A larger batch changes the optimiser's noise, not the reward it optimises: it cannot separate the proxy from the optimiser.",
        "B": "Removing the KL penalty changes how far the optimiser goes, with the same proxy: it cannot tell whose fault the fall is.",
        "D": "The proxy's accuracy on held-out pairs says how good it is on average, not whether optimising it caused the fall.",
    },
    ("ex13_kl_as_a_tool", "q4"): {
        "A": "A small KL to the uniform policy means the policy is close to random: it explores a lot, not too little.",
        "B": "A large KL to the uniform policy means a nearly deterministic policy, which explores little.",
        "D": "KL(pi || u) = log |A| - H(pi): it is the entropy's gap to its maximum.",
    },
    ("ex13_kl_as_a_tool", "q5"): {
        "A": "Task B's states are not where pi_A's behaviour must be kept: the penalty has to be measured on task A's states.",
        "C": "An entropy bonus keeps the policy random, not close to what pi_A does on task A.",
        "D": "The KL to the uniform policy measures the entropy, not the distance to pi_A.",
    },
    ("ex14_review", "q1"): {
        "A": "The surrogate is differentiable without a KL term; the constraint is there because the surrogate is only accurate near pi_old.",
        "C": "Entropy collapse is handled by an entropy bonus; the KL constraint keeps the importance-weighted surrogate accurate.",
        "D": "PPO and TRPO on an environment have no learned reward; the surrogate built from pi_old's samples is what must stay valid.",
    },
    ("ex14_review", "q2"): {
        "A": "The two directions give different Gaussians on a two-mode target: one covers both modes, the other picks one.",
        "B": "KL(q || p) pays for q's mass where p is small, such as between the modes, so q avoids that region.",
        "D": "It is the other way round: the forward KL covers both modes and the reverse KL locks onto one.",
    },
    ("ex14_review", "q4"): {
        "A": "Converging policies change less per update, so the measured KL falls, not jumps.",
        "B": "Larger advantages with the same learning rate taking a much larger step is exactly the unintended move a spike signals.",
        "C": "A spike together with a falling return is a real move of the policy, not estimator noise.",
    },
    ("ex14_review", "q5"): {
        "A": "RLHF penalises the reverse KL (an expectation under the policy, mode seeking), not the forward one.",
        "C": "Sampling only from the model and evaluating its log-probabilities is the setting of the reverse KL.",
        "D": "With a single-mode target both directions have unique minimisers; the forward KL's case is imitation from data.",
    },
    ("ex14_offpolicy_kl", "q6"): {
        "A": "s = W**(1/|y|) is not an importance weight: E_old[s] is not 1 in general, so E_old[s f] is not E_theta[f].",
        "C": "s equals W only for responses of one token; for longer ones it is W's |y|-th root.",
        "D": "exp of the mean log-ratio is the geometric mean of the token ratios, never above their arithmetic mean.",
    },
    ("ex14_offpolicy_kl", "q7"): {
        "A": "Ratio clipping masks the token once pi > (1 + 0.2) * 0.01 = 0.012, far below 0.21.",
        "B": "The TV rule bounds the change pi - pi_old by 0.2, not the ratio: it lets the token rise to 0.21.",
        "D": "0.0102 is neither threshold: ratio clipping stops at 0.012, the TV rule at 0.01 + 0.2 = 0.21.",
    },
    ("ex15_exploration_anchors_optimum", "q7"): {
        "B": "With A < 0 the minimum picks the unclipped rho A whenever rho > 1, so eps_high never bounds a falling token, and the upper bound is 1.28, not 1.2.",
        "C": "PPO's clip bounds the ratio pi_theta / pi_old, not the difference pi_theta - pi_old: the token stops at 1.28 * 0.02.",
        "D": "A token with A < 0 and a ratio above 1 + eps_high keeps its gradient: min(rho A, 1.28 A) is the unclipped rho A there.",
    },
    ("ex15_exploration_anchors_optimum", "q8"): {
        "A": "Equal rewards cancel in pi*(a) / pi*(b) = pi_ref(a) / pi_ref(b) exp((r(a) - r(b)) / beta), so the 9:1 ratio survives every beta.",
        "C": "Equal rewards leave the reference's ratio untouched: the optimum evens them out only if the rewards are changed.",
        "D": "The forward-KL optimum beta pi_ref(a) / (lambda - r(a)) also keeps pi_ref's ratio when r(a) = r(b).",
    },
    ("project1_ppo_kl", "q5"): {
        "A": "A truncated episode did not end in a failure: its last state has a value, so treating it as terminal biases the advantages down.",
        "B": "After an auto-reset the returned obs is the next episode's first state, whose value says nothing about the truncated one's future.",
        "D": "The truncated episode is over: carrying the sum into the next episode mixes the returns of two episodes.",
    },
    ("project2_ppo_rlhf", "q6"): {
        "A": "The penalties of the tokens add up to beta times the sequence's log-ratio, so the score is not the whole return: the KL terms count too.",
        "C": "The sampled log-ratio's expectation is taken under pi_theta, which samples the tokens: that is KL(pi_theta || pi_ref), not KL(pi_ref || pi_theta).",
        "D": "Without discounting nothing is lost along the response: every token's penalty reaches the return, not only the last token's.",
    },
    ("project3_grpo_kl", "q5"): {
        "A": "An unbiased estimate of the KL's value does not give its gradient: k3 differentiated per token has the expected gradient of a per-position forward KL, not that of KL(pi_theta || pi_ref).",
        "C": "Differentiating k3 token by token drops the score-function part: no token is charged for the KL its choice causes at the later positions, and even one token's gradient is that of KL(pi_ref || pi_theta).",
        "D": "A sampled estimate can be exact in expectation: the policy-gradient theorem makes E[K(y) grad log pi_theta(y)] equal grad KL(pi_theta || pi_ref) when K(y) is the sequence's summed log-ratio.",
    },
}
