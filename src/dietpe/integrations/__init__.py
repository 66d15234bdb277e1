"""diet's position methods inside other people's models: `attach` for Hugging Face models of the common
families (one file per family), `Positions` for your own attention module."""

from dietpe.integrations.core import FAMILIES, attach
from dietpe.integrations.standalone import Positions

__all__ = ["attach", "Positions", "FAMILIES"]
