"""``python -m distmb.predict`` (:mod:`distmb.cli.predict`) and the public function
``distmb.predict(...)`` (:func:`distmb.engine.predict.predict`).

``distmb.predict`` names both this module and that function: importing the module binds the
module to that name on the package, so the module itself calls the function
(``distmb.predict(...)`` works in either order of imports).
"""

from __future__ import annotations

import sys
import types
from typing import Any

from distmb.cli.predict import main
from distmb.engine.predict import Prediction, predict

__all__ = ["Prediction", "main", "predict"]


class _CallableModule(types.ModuleType):
    """This module, callable: calling it calls :func:`predict`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Prediction:
        return predict(*args, **kwargs)


if __name__ == "__main__":
    sys.exit(main())
else:
    sys.modules[__name__].__class__ = _CallableModule
