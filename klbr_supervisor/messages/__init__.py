"""Jupyter messages as frames: cut and signed (`protocol`, standard library only: the kernel's
stand-in imports it before anything heavy), decoded as far as the relay needs (`wire`), and
delivered on the loop (`sockets`). Nothing is imported here, so `protocol` stays light."""
