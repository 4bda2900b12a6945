"""ftplan: plan LLM fine-tuning jobs before buying GPU-hours.

The public API is re-exported here from private modules. Importing ftplan never imports
torch or transformers and loads no data file: catalogs are read on first use.
"""

from .errors import CatalogError, ConfigError, FtplanError, InfeasibleError, NotFoundError

__version__ = "0.1.0"

__all__ = [
    "__version__",
    "FtplanError",
    "ConfigError",
    "CatalogError",
    "NotFoundError",
    "InfeasibleError",
]
