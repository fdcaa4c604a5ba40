"""Task data and prompts: one folder per suite, each organised alike, and the pieces every suite shares.

Shared: `specs` (a suite's task files under suites/<suite>/, or a user's from --include-path: read, included,
checked in one line) and `data` (local or hub splits). A suite's folder holds, as far as it needs them: `spec`
(what its task files must hold), `docs`/`inputs`/`haystack` (rows or sources to documents, examples or instances),
`prompts`, `prepare` (everything read before the model loads), `evaluate` (one unit answered or scored: shared
work read once) and `results` (records to scores). Its command in `commands/` wires them to the run skeleton.
docs/adding-a-suite.md says how a new suite is added.
"""
