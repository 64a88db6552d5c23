"""Diagnosis: BC on Simglucose with and without observation normalization (dataset mean/std)."""
import sys, numpy as np, jax, jax.numpy as jnp
sys.path.insert(0, '/work/main')
import envs.tasks
from envs.tasks import get_task
from agents.bc import BC, BCConfig
from mbrl.core.types import Transitions
from mbrl.datasets import load
task = get_task('Simglucose')
data = load('neorl2:Simglucose').transitions
obs = np.asarray(data.obs); act = np.asarray(data.action)
mean, std = obs.mean(0), obs.std(0) + 1e-3
print('obs |mean| max', np.abs(mean).max(), 'dims with std<1e-2:', int((obs.std(0) < 1e-2).sum()))
U, B = 20000, 256
for norm in (False, True):
    scores = []
    for seed in range(3):
        rng = np.random.default_rng(seed)
        rows = rng.integers(0, len(obs), (U, B))
        x = (obs - mean) / std if norm else obs
        agent = BC(BCConfig(), obs.shape[1], 1)
        state = agent.init(jax.random.PRNGKey(seed))
        upd = jax.jit(agent.update_many)
        for c in range(0, U, 2000):
            r = rows[c:c + 2000]
            b = Transitions(obs=jnp.asarray(x[r]), action=jnp.asarray(act[r]), reward=jnp.zeros(r.shape), next_obs=jnp.asarray(x[r]),
                            terminal=jnp.zeros(r.shape, bool), timeout=jnp.zeros(r.shape, bool))
            state, _ = upd(state, b, jax.random.PRNGKey(c))
        pol = jax.jit(lambda o: agent.deterministic_action(state.actor_params, o))
        err = float(np.mean(np.abs(np.asarray(pol(jnp.asarray(x[:20000]))) - act[:20000])))
        env = task.make_env(); rets = []
        for ep in range(30):
            o, _ = env.reset(seed=10_000 + seed * 30 + ep); ret = 0.0; done = False
            while not done:
                a = np.asarray(pol(jnp.asarray(((o - mean) / std if norm else o)[None].astype(np.float32))))[0]
                o, r, te, tr, _ = env.step(a); ret += r; done = te or tr
            rets.append(ret)
        score = 100 * (np.mean(rets) - task.ref_min_score) / (task.ref_max_score - task.ref_min_score)
        scores.append(score)
        print(f'normalized_obs={norm} seed={seed} action_mae={err:.4f} score={score:.1f}', flush=True)
    print(f'normalized_obs={norm}: {np.mean(scores):.1f} +- {np.std(scores)/np.sqrt(3):.1f}', flush=True)
