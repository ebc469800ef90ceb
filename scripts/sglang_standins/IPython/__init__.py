"""Import-time stand-in for IPython.

Needed by: sglang/utils.py (`from IPython.display import HTML, display`), imported
by sglang/__init__.py's frontend-language exports.
Why a stand-in suffices: notebook display helpers; nothing in the runners renders HTML.
The real IPython pulls in ~15 packages (jedi, prompt_toolkit, pygments, ...).
"""
from _cgsim_standin import install

install(__name__)
