"""Rules for the converter's pooling ops."""
