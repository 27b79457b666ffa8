# autotune on a CUDA PyTorch image: torch (CUDA build) comes from the base image, so pip keeps it
# (autotune only asks for torch>=2.4) and adds optuna, SQLAlchemy, NVML bindings and the CLI.
#   docker build -t autotune .
#   docker run --gpus all -v $PWD:/work -w /work autotune run --budget 40GB train.py
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

ENV PYTHONUNBUFFERED=1 \
    AUTOTUNE_CACHE_DIR=/cache
WORKDIR /opt/autotune
COPY pyproject.toml README.md ./
COPY autotune ./autotune
COPY storage ./storage
RUN pip install --no-cache-dir . && autotune --help >/dev/null

VOLUME /cache
ENTRYPOINT ["autotune"]
CMD ["--help"]
