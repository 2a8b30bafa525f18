"""store layer (see ARCHITECTURE.md §9)."""
