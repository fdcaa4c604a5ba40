"""What `megaeval report` and `megaeval plot` make of reports: tables, one HTML page, pictures.

Rooms: `kinds` (KINDS, the one registry of report kinds: each kind's title, terminal/markdown/CSV table and HTML
section; `compare` and the summaries commands print), `page` (the self-contained HTML page, its style and script
in static/), `sections` (each kind's HTML section), `samples` (samples files read for the page's sample browser),
`svg` (the page's charts and heatmaps), `plot` and `plot_retrieval` (matplotlib pictures).
"""
