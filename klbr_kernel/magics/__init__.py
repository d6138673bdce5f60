"""`%klbr` cells: parsed, carried out, and the status they report."""
