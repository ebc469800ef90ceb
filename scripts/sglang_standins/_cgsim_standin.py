"""Helper for the import-time stand-ins in this folder (not a stand-in itself).

install(__name__) makes the calling stand-in package, and any submodule of it
(`import X.a.b`), resolve every attribute to an inert class. An inert class can be
imported, subclassed (with class keywords), called, indexed and have attributes
looked up on it or its instances, so module-level code such as
`class C(PretrainedConfig): ...`, `logger = logging.get_logger(__name__)` or
`AutoConfig.register("x", C)` runs. Nothing behind them works: these packages sit
on sglang's import chain but the CUDA-graph runners never call them.
"""
import importlib.abc
import importlib.util
import sys

_PREFIXES = set()


class _InertMeta(type):
    def __getattr__(cls, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _inert(attr, cls.__module__)

    def __getitem__(cls, key):
        return _inert("item", cls.__module__)

    def __setitem__(cls, key, value):
        pass

    def __iter__(cls):
        return iter(())

    def __contains__(cls, key):
        return False

    def __or__(cls, other):  # PEP 604 unions in annotations: Inert | None
        return cls

    __ror__ = __or__


class _Inert(metaclass=_InertMeta):
    def __init__(self, *args, **kwargs):
        pass

    def __init_subclass__(cls, **kwargs):
        pass

    @classmethod
    def __get_pydantic_core_schema__(cls, source, handler):
        # pydantic models in sglang's OpenAI protocol use stand-in types as fields
        from pydantic_core import core_schema
        return core_schema.any_schema()

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _inert(attr, type(self).__module__)()

    def __call__(self, *args, **kwargs):
        return self

    def __getitem__(self, key):
        return self

    def __setitem__(self, key, value):
        pass

    def __iter__(self):
        return iter(())


def _inert(name, module):
    return _InertMeta(name, (_Inert,), {"__module__": module, "__qualname__": name})


def _getattr_for(modname):
    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _inert(attr, modname)
    return __getattr__


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if any(fullname.startswith(p + ".") for p in _PREFIXES):
            return importlib.util.spec_from_loader(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__getattr__ = _getattr_for(module.__name__)


def install(name, **attrs):
    """Turn the stand-in package `name` (already in sys.modules) into an inert one."""
    pkg = sys.modules[name]
    pkg.__getattr__ = _getattr_for(name)
    pkg.__dict__.update(attrs)
    if not _PREFIXES:
        sys.meta_path.append(_Finder())
    _PREFIXES.add(name)
    return pkg
