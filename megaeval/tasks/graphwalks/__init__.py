"""Graphwalks (openai/graphwalks): a directed graph of hash-named nodes as an edge list, and a breadth-first search
(`bfs`) or a parent lookup (`parents`) to perform; the answer the last line's `Final Answer: [...]`, scored by set F1.

Rooms: `data` (the published files, checked), `results` (means per problem type and prompt_chars bucket); tables:
`tasks.mrcr.tables` (one reader for both suites' tables). Scoring: `metrics.graphwalks`; command:
`commands.graphwalks`.
"""
