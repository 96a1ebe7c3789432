"""One module per area of the system; each defines ``AREA``. Modules are found by listing this package,
so adding an area is adding a file: no shared list to edit, no merge conflict."""
