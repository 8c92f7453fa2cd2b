"""The false-negative audit of a run: which negatives it used, what a judge says of them."""
