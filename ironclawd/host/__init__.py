"""host layer (see ARCHITECTURE.md §9)."""
