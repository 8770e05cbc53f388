"""One module per round (``r01_layout`` ... ``r07_...``): each round's logic beside its notebook of the same
number (``notebooks/NN_*.py``)."""
