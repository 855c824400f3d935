"""Rules for the converter's reductions ops."""
