"""RULER (Hsieh et al., 2024): 13 synthetic tasks (eight needle-in-a-haystack variants, variable tracking, common
and frequent words extraction, two QA tasks) at any length, with RULER's own instances byte for byte.

Rooms: `spec` (task files checked), `inputs` (essays, QA files, word lists, Punkt, RULER's token count), `fitting`
(RULER's haystack search), one generator per RULER script (`niah`, `variable_tracking`, `words`: cwe and fwe,
`qa`) and `data` (the generator of each kind; RULER's on-disk layout read and written). Command: `commands.ruler`.
"""
