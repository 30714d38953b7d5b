"""JupyterLab opens this project's notebooks without marking them changed.

On opening a notebook, JupyterLab writes two things the kernel reports into the notebook's metadata: the kernel's
display name and `language_info` (with the Python version). The notebooks are stored clean (nbdev_clean keeps
neither), so every notebook looked changed the moment it was opened. This contents manager, installed for the
project's venv by `make install`, fills both in as the kernel will report them when a notebook is read; nbdev's
save hook (`jupyter_hooks = True` in settings.ini) strips them again when it is written. Nothing on disk changes.
"""
import sys

from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager


def kernel_metadata(kernel_name: str) -> dict:
    "The `kernelspec` and `language_info` a Python kernel of this environment reports (as ipykernel does)."
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel
    try: display = KernelSpecManager().get_kernel_spec(kernel_name).display_name
    except NoSuchKernel: return {}
    info = {"codemirror_mode": {"name": "ipython", "version": sys.version_info[0]}, "file_extension": ".py", "mimetype": "text/x-python",
            "name": "python", "nbconvert_exporter": "python", "pygments_lexer": f"ipython{sys.version_info[0]}", "version": sys.version.split()[0]}
    return {"kernelspec": {"display_name": display, "language": "python", "name": kernel_name}, "language_info": info}


class CleanOpenContentsManager(AsyncLargeFileManager):
    "Serves notebooks with the kernel's own metadata filled in, so that opening one changes nothing."
    async def get(self, path, content=True, type=None, format=None, **kwargs):
        model = await super().get(path, content=content, type=type, format=format, **kwargs)
        if content and model.get("type") == "notebook" and model.get("content"):
            meta = model["content"].setdefault("metadata", {})
            name = meta.get("kernelspec", {}).get("name")
            if name: meta.update(kernel_metadata(name))
        return model
