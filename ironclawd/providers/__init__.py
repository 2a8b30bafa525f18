"""Model providers: the only code that talks to a model API (adapters, like host/ and store/)."""
