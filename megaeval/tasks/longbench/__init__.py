"""LongBench (Bai et al., ACL 2024: 21 tasks in six categories, English and Chinese, and the length-balanced
LongBench-E) and LongBench v2 (Bai et al., 2024: 503 multiple-choice questions over 8K-2M-word contexts), as
THUDM/LongBench (2e00731) builds, cuts and scores their prompts.

Rooms: `spec` (task files checked; v2's templates), `data` (the records and prediction lines, checked by one rule
per record type), `prompts` (the official prompt building and the two middle truncations), `evaluate` (the run's
limit, the samsum stop, per-item seeds, token estimates), `results` (per-task scores, the leaderboard, LongBench-E's
buckets, v2's figures) and `tables` (a report's results read, checked, as the tables `megaeval report` shows).
Scoring: `metrics.longbench`; command: `commands.longbench` (and `commands.longbench_files`).
"""
