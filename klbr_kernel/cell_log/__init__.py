"""The cell log's kernel side: recording each cell, `%klbr replay`, and the `klbr` comm that
restores a page's outputs (the store itself is `klbr_supervisor.store`)."""
