"""sdpa-port: port eager attention in Transformers modeling files to torch's scaled_dot_product_attention."""

from sdpa_port.api import port_source
from sdpa_port.result import PortResult, Status, Style

__all__ = ["port_source", "PortResult", "Status", "Style"]
__version__ = "0.1.0"
