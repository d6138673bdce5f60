"""Constants of the Jupyter wire protocol that both the early front and the relay need.

Standard library only and no imports at all: `klbr_kernel.early` imports it before anything heavy.
"""

# Separates a message's routing prefix from its signed body (jupyter_client's Session.DELIM).
DELIM = b"<IDS|MSG>"
