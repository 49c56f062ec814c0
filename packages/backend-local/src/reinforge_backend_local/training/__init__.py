"""Turning scored rollouts into updates.

The algorithm records (``algorithms``), the policy-gradient update (``trainer``) over a padding-free
micro-batch layout (``layout``) and its sequence-by-sequence attention (``attention``); one training
run (``session``) with where it stands (``state``), what it prints (``progress``) and logs
(``metrics_log``); and the adapter trainer online learning runs one batch at a time (``adapter_trainer``).
"""
