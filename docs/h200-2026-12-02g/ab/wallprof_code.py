# Wall-clock marginal cost per kernel family of a decode step at KV 513, the same code natively
# and in the page (cera.python): 16 steps a submission, best of 5; a family's dispatches doubled.
import json, re, time
from cera.device import Binding
from cera.gpu.plan import Dispatch
from cera.gpu.state import pack_step
try:
    from cera_web.app import _sessions
    e = _sessions[-1].engine
except ImportError:
    e = ENGINE
m = e.backend
dev = m.device
steps = list(m.decode_plan.steps)
dev.write(m.state.step.buffer, pack_step(512, 1))
read = Binding(m.state.tokens.buffer, 0, 4)
REPS, ROUNDS = 16, 5
async def timed(ss):
    sched = dev.schedule(ss * REPS)
    await dev.run(sched, read)
    best = 1e9
    for _ in range(ROUNDS):
        t = time.perf_counter()
        await dev.run(sched, read)
        best = min(best, time.perf_counter() - t)
    return best / REPS * 1e6
fam = lambda s: re.sub(r"^blk\.\d+\.", "", s.label)
base = await timed(steps)
res = {"step_us": round(base, 1)}
for f in sorted({fam(s) for s in steps if isinstance(s, Dispatch)}):
    doubled = [d for s in steps for d in ((s, s) if isinstance(s, Dispatch) and fam(s) == f else (s,))]
    res[f] = round(await timed(doubled) - base, 1)
RESULT = json.dumps(res)
RESULT
