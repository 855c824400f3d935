"""Rules for the converter's indexing ops."""
