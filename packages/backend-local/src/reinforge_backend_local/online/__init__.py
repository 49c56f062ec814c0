"""reinforge-online's ``local`` committer: live traffic trained into policy versions.

The gateway's side (``committer``: no torch), its worker process where batches are trained
(``worker``), checks of a version on a run file's eval set (``version_check``) and the baselines
for ungrouped rewards (``baselines``).
"""
