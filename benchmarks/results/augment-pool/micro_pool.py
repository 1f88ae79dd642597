# Run on commit cca4d76 (batchaug.policy had pool= then): python micro_pool.py one|pool

import sys, time, json, numpy as np, torch
sys.path.insert(0, "/work/wt-dropin2")
torch.set_num_threads(1)
from torchvision import transforms as T
from timm.data import create_transform
from fastload.transforms import translate
from fastload.augment.policies import plan
from fastload.batchaug import policy
from fastload.host import DecodePool
pooled = sys.argv[1] == "pool"
a = translate(create_transform(224, is_training=True, color_jitter=0.3, auto_augment="rand-m9-mstd0.5-inc1", interpolation="bicubic"))
x = torch.from_numpy(np.random.default_rng(0).standard_normal((64, 3, 224, 224), dtype=np.float32))
pool = DecodePool(2) if pooled else None
t = time.perf_counter(); n = 0
for b in range(8):
    plans = plan(a.policy, seed=1, epoch=0, positions=np.arange(64 * b, 64 * b + 64))
    policy(x, plans, library="timm", mean=a.mean, std=a.std, fill=a.policy.fill, pool=pool); n += 64
print(json.dumps({"mode": sys.argv[1], "images_per_s": n / (time.perf_counter() - t)}))
if pool: pool.close()
