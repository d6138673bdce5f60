"""`klbr-kernel COMMAND`: kernelspec install and the cell log's readers."""
