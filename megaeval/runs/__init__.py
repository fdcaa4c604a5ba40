"""The one run skeleton every evaluation uses: settings, open_run (outputs checked, model loaded, facts and
fingerprint recorded, journal opened), the resume journal, the progress bar and the report."""

from .journal import Journal
from .progress import ProgressBar
from .report import SCHEMA_VERSION, build_report, environment, load_report, model_facts
from .run import Run, open_run
from .settings import RunSettings

__all__ = [
    "SCHEMA_VERSION", "Journal", "ProgressBar", "Run", "RunSettings", "build_report", "environment", "load_report",
    "model_facts", "open_run",
]  # fmt: skip
