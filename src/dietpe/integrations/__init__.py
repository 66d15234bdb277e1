"""diet's position methods inside other people's models: `attach` for Hugging Face models of the common
families (one file per family), `Positions` for your own attention module.

`core` holds the machinery and the table of families; each family's file registers itself there, and this
package imports them, so every family is known before `core` is reached from outside.
"""

from dietpe.integrations import bert, gpt2, llama  # noqa: F401  (each registers its family)
from dietpe.integrations.core import FAMILIES, attach
from dietpe.integrations.standalone import Positions

__all__ = ["attach", "Positions", "FAMILIES"]
