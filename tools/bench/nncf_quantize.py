#!/usr/bin/env python3
"""NNCF post-training int8 quantization of an ONNX model for OpenVINO (bench_int8.py runs it in its
own Python, .venv-nncf: NNCF 3 wants a newer torch and numpy than Debian's torch 1.13 venv has).
    nncf_quantize.py MODEL.onnx CALIB.npy OUT.xml
CALIB.npy: the calibration images, preprocessed, (N, C, H, W) float32."""
import sys
import time

import numpy as np
import nncf
import openvino as ov


def main():
    onnx_path, calib_path, out = sys.argv[1:4]
    x = np.load(calib_path)
    model = ov.Core().read_model(onnx_path)
    t0 = time.perf_counter()
    q = nncf.quantize(model, nncf.Dataset([x[i:i + 1] for i in range(len(x))]), subset_size=len(x),
                      preset=nncf.QuantizationPreset.PERFORMANCE)
    ov.save_model(q, out)
    print(f"nncf {nncf.__version__}, openvino {ov.__version__.split('-')[0]}: quantized on {len(x)} images in "
          f"{time.perf_counter() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
