"""End-to-end exercise tasks: the training runs the graded notebooks plug their code into.

Each module trains something with a student's functions and checks the outcome:

    cartpole_kl    exercise 3: a KL-penalty PPO loss and the adaptive beta rule train CartPole
                   (:mod:`klbook_lib.ppo`); the outcome is the trained policy's return and the
                   KL of the updates
    micro_rlhf     exercises 7 and 8: a word-level micro GPT-2 reference policy built in
                   seconds, PPO-RLHF with a student's per-token reward and masked GAE
                   (:mod:`klbook_lib.rlhf.ppo`), DPO with a student's loss
                   (:mod:`klbook_lib.dpo`); the outcome is reward and KL of the tuned policy
    ppo_kl_project project 1: the student's own KL-penalty PPO on the batched CartPole; this module
                   fixes only the actor's shape and judges the returned actor (return played
                   here, the last update's KL recomputed, beta checked against the rule)
    grpo_project   project 3: the student's own GRPO on the enumerable sequence model
                   (:mod:`klbook_lib.seqkl`); this module hands out the problem and its plumbing
                   and judges the returned logits tables exactly (reward and KL by enumeration)
    token_trainer  exercise 5: the toy token-level problem of the "broken trainer" (a tabular
                   autoregressive policy whose KL and reward are exact, :mod:`klbook_lib.seqkl`),
                   its dashboard and the exact evaluation of a training run

A driver returns plain data (the trained parameters and the logged history). The grader
evaluates the parameters *in its own process* with the ``judge_*`` functions here (it
runs the returned policy itself), so a notebook cannot print or return a good number; see
``grading.md`` for what an outcome task can and cannot guarantee. The same judges run in a
student's notebook through ``check()``.

Nothing here implements an exercise's answer: the students' functions are arguments.
"""
