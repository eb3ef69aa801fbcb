#!/usr/bin/env python3
"""Writes a benchmark image as an OCI layout: SIZE_MB of content in three
gzip layers (a few large incompressible files, many small text files),
like a typical application image. Standard library only.

usage: mkimage.py DIR TAG SIZE_MB"""
import gzip, hashlib, io, json, os, random, sys, tarfile

out, tag, size_mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
os.makedirs(f"{out}/blobs/sha256", exist_ok=True)
rng = random.Random(42)

def blob(data):
    d = hashlib.sha256(data).hexdigest()
    with open(f"{out}/blobs/sha256/{d}", "wb") as f:
        f.write(data)
    return "sha256:" + d, len(data)

def layer(files):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as t:
        for name, data in files:
            ti = tarfile.TarInfo(name)
            ti.size, ti.mode, ti.mtime = len(data), 0o644, 1700000000
            t.addfile(ti, io.BytesIO(data))
    tar = raw.getvalue()
    diff = "sha256:" + hashlib.sha256(tar).hexdigest()
    gz = gzip.compress(tar, compresslevel=6, mtime=0)
    d, n = blob(gz)
    return {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d, "size": n}, diff

total = size_mb << 20
big = [(f"opt/app/data{i}.bin", rng.randbytes(total * 6 // 10 // 4)) for i in range(4)]
words = [rng.choice(["alpha", "beta", "gamma", "delta", "kinglet", "node", "pod"]) for _ in range(4096)]
text = " ".join(words).encode()
small = [(f"usr/share/doc/pkg{i}/README", text[: rng.randint(2000, 8000)] * 4) for i in range(2000)]
third = len(small) // 2
layers, diffs = [], []
for files in (big, small[:third], small[third:]):
    desc, diff = layer(files)
    layers.append(desc)
    diffs.append(diff)
config = json.dumps({"architecture": sys.argv[4] if len(sys.argv) > 4 else "amd64", "os": "linux",
                     "config": {"Cmd": ["/bin/true"]}, "rootfs": {"type": "layers", "diff_ids": diffs}}).encode()
cd, cn = blob(config)
manifest = json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                       "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cn},
                       "layers": layers}).encode()
md, mn = blob(manifest)
with open(f"{out}/index.json", "w") as f:
    json.dump({"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
               "digest": md, "size": mn, "annotations": {"org.opencontainers.image.ref.name": tag}}]}, f)
with open(f"{out}/oci-layout", "w") as f:
    f.write('{"imageLayoutVersion":"1.0.0"}')
print(sum(l["size"] for l in layers))
