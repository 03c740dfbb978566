"""The servers (node, controller) and the apps, imported as `snapmesh.services`:
snapmesh/services links here, and the wheel ships this folder under that name."""

if __name__ != "snapmesh.services":
    # A second import path would load every module twice, each copy with its own state.
    raise ImportError(f"import snapmesh.services, not {__name__}")
