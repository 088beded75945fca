"""Trains a small scikit-learn model and writes an MLServer model repository.

    python mlserver_model.py DIR HTTP_PORT GRPC_PORT METRICS_PORT

DIR/settings.json (server: loopback, the given ports, no worker processes) and
DIR/iris/{model.joblib, model-settings.json}. The data set is generated here, with a
fixed seed, so nothing is downloaded.
"""

import json
import os
import sys

import joblib
import numpy as np
from sklearn.linear_model import LogisticRegression

root, http_port, grpc_port, metrics_port = sys.argv[1], *map(int, sys.argv[2:5])
rng = np.random.default_rng(7)
centers = np.array([[0.0, 0.0, 0.0, 0.0], [3.0, 3.0, 0.0, 1.0], [0.0, 3.0, 3.0, -1.0]])
x = np.concatenate([c + rng.normal(0, 0.6, size=(60, 4)) for c in centers])
y = np.repeat(np.arange(3), 60)
model = LogisticRegression(max_iter=500).fit(x, y)

os.makedirs(os.path.join(root, "iris"), exist_ok=True)
joblib.dump(model, os.path.join(root, "iris", "model.joblib"))
with open(os.path.join(root, "iris", "model-settings.json"), "w") as f:
    json.dump({"name": "iris", "implementation": "mlserver_sklearn.SKLearnModel", "parameters": {"uri": "./model.joblib"}}, f)
with open(os.path.join(root, "settings.json"), "w") as f:
    json.dump(
        {
            "host": "127.0.0.1",
            "http_port": http_port,
            "grpc_port": grpc_port,
            "metrics_port": metrics_port,
            "parallel_workers": 0,
        },
        f,
    )
