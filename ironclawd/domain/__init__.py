"""domain layer (see ARCHITECTURE.md §9)."""
