"""flowerapp: a Flower / PyTorch app."""
