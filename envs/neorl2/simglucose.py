"""NeoRL-2's Simglucose: basal insulin control of a virtual type-1 diabetic patient.

Written from NeoRL-2's definitions (polixir/NeoRL2: `neorl2/envs/simglucose.py`, the simulator under
`neorl2/envs/data/simglucose/`, reward in `neorl2/envs/reward/simglucose_reward.py`, termination in
`neorl2/envs/terminated/simglucose_terminated.py`); the simulator is Jinyu Xie's simglucose (v0.2.1), a
re-implementation of the UVA/Padova type-1 diabetes model, as NeoRL-2 modified it.

The parameter tables beside this module are NeoRL-2's, copied unchanged (CSV holds no comments):
`simglucose_patients.csv` from `neorl2/envs/data/simglucose/patient/vpatient_params.csv` (30 virtual
patients: initial state x0_1..x0_13 and model constants), `simglucose_sensors.csv` from
`.../sensor/sensor_params.csv`, `simglucose_pumps.csv` from `.../actuator/pump_params.csv`.

What is faithful: the 13-state ODE, integrated as NeoRL-2 does (scipy's `ode` with `dopri5` at its default
tolerances, one call per simulated minute, inputs held over the minute); the meal digestion bookkeeping;
the insulin pump's quantisation and bounds; the CGM sensor's 3-minute sampling with zero-order hold and its
clip to [10, 600]; the 3-minute averaging that makes the observation; the reward; the termination on the
true (not sensed) blood glucose; the patient sets of the two modes; the per-episode draws (a patient and a
start hour, both uniform). NeoRL-2 switched off every other source of randomness, and so does this env:
the CGM noise is zero (its `cgm.py` adds 0), every day has the same six meals at their mean times and
amounts (its `scenario_gen.py` takes the means), and the initial state is the table's (no random initial
glucose). The env is therefore deterministic given (patient, start hour, actions).

The observation (31 floats) is the CGM reading averaged over the last step's three minutes, then the
patient's 30 constant properties. The ODE state (13 values) and the meal schedule are hidden, so a dataset
row does not determine the state and there is no `set_state_from_obs`; instead a file's episode is replayed
from its start: `reset(seed=i)` draws the patient and start hour of the released files' episode i, and the
file's actions then reproduce its rows.
"""

from __future__ import annotations

import csv
import functools
import math
from pathlib import Path

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
from scipy.integrate import ode

_HERE = Path(__file__).resolve().parent

# NeoRL2 neorl2/envs/simglucose.py patient_property_names: the 30 patient constants appended to the obs.
PATIENT_PROPERTY_NAMES = (
    "BW", "Fsnc", "Ib", "Km0", "Vi", "Vm0", "Vmx", "b", "d", "f", "k1", "k2", "ka1", "ka2", "kabs", "kd",
    "ke1", "ke2", "ki", "kmax", "kp1", "kp2", "kp3", "ksc", "m1", "m2", "m30", "m4", "p2u", "u2ss",
)
OBS_NAMES = ("cgm",) + PATIENT_PROPERTY_NAMES
# Normalised basal insulin rate in [-1, 1].
ACT_NAMES = ("insulin",)
# NeoRL2 sensor_params.csv: the Dexcom sensor samples every 3 minutes, and a step is one sample.
STEP_MINUTES = 3
CONTROL_HZ = 1.0 / (60.0 * STEP_MINUTES)
# NeoRL2 neorl2/__init__.py: Simglucose registered with max_episode_steps=480 (24 hours).
EPISODE_STEPS = 480
# NeoRL2 neorl2/envs/simglucose.py SimglucoseEnv.observation_space: [0, 1000] for the CGM, then these
# bounds for the properties (loose: they cover all 30 patients, not each property's range).
OBS_LOW = (0.0, 23, 1, 82, 185, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 339, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0)
OBS_HIGH = (1000.0, 112, 1, 139, 279, 1, 15, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1, 1, 339, 1, 1, 12, 1, 1, 1, 1, 1, 1,
            1, 1, 3)

# NeoRL2 neorl2/envs/simglucose.py T1DSimEnvNeoRL: the patients of each mode.
_GROUPS = ("adolescent", "adult", "child")
PATIENTS = {
    "train": tuple(f"{g}#{i:03d}" for g in _GROUPS for i in range(1, 6)),
    "test": tuple(f"{g}#{i:03d}" for g in _GROUPS for i in range(6, 11)),
}
# NeoRL2 neorl2/envs/simglucose.py SimglucoseEnv.step: the action maps affinely onto [0, 5] U/min.
MAX_INSULIN = 5.0
# NeoRL2 .../simulation/scenario_gen.py create_scenario: every meal is taken, at its mean time (minute of
# the day) with its mean amount (g of carbohydrate).
MEALS = ((420, 45.0), (570, 10.0), (720, 70.0), (900, 10.0), (1080, 80.0), (1290, 10.0))
# NeoRL2 .../patient/t1dpatient.py: a meal is eaten at 5 g/min, the ODE stepped one minute at a time.
EAT_RATE = 5.0
# NeoRL2 .../simulation/envNeoRL.py step: the episode ends when the step's mean blood glucose leaves
# [40, 600] mg/dL. NeoRL2 reward/simglucose_reward.py: -15 at or below 40, 0 at or above 600.
BG_LOW, BG_HIGH = 40.0, 600.0
_PENALTY_LOW = -15.0
U_TO_PMOL = 6000.0  # NeoRL2 .../actuator/pump.py and t1dpatient.py: 1 U of insulin = 6000 pmol


@functools.lru_cache(maxsize=None)
def _table(name: str) -> dict[str, dict[str, float]]:
    """A parameter table beside this module: {row name: {column: value}}."""
    with open(_HERE / name, newline="") as fh:
        rows = list(csv.DictReader(fh))
    return {r["Name"]: {k.replace(" ", ""): float(v) for k, v in r.items() if k != "Name"} for r in rows}


def patient_params(name: str) -> dict[str, float]:
    """The named patient's row of NeoRL-2's vpatient_params.csv (x0_1..x0_13 is the initial state)."""
    return dict(_table("simglucose_patients.csv")[name])


def _sensor() -> dict[str, float]:
    return _table("simglucose_sensors.csv")["Dexcom"]  # NeoRL2 neorl2/envs/simglucose.py SENSOR_HARDWARE


def _pump() -> dict[str, float]:
    return _table("simglucose_pumps.csv")["Insulet"]  # NeoRL2 neorl2/envs/simglucose.py INSULIN_PUMP_HARDWARE


# -- reward and termination ----------------------------------------------------------------------------------

def _risk(bg, xp):
    # NeoRL2 reward/simglucose_reward.py: the Kovatchev risk of a glucose reading (mg/dL).
    f = 1.509 * (xp.log(bg) ** 1.084 - 5.381)
    return 10.0 * f * f


def reward(obs, action, next_obs) -> jax.Array:
    """The fall of the glucose risk from `obs` to `next_obs`, shifted by 1: (risk - next_risk) / 100 + 1.

    NeoRL2 reward/simglucose_reward.py; -15 where the next reading is at or below 40, 0 at or above 600.
    Readings are clipped to the sensor's range [10, 600] first: every reading the task can produce lies in
    it already, and the clip keeps the log finite on a model's out-of-range predictions.
    """
    del action
    lo, hi = _sensor()["min"], _sensor()["max"]
    bg = jnp.clip(jnp.asarray(obs)[..., 0], lo, hi)
    nbg = jnp.clip(jnp.asarray(next_obs)[..., 0], lo, hi)
    r = (_risk(bg, jnp) - _risk(nbg, jnp) + 100.0) / 100.0
    r = jnp.where(nbg <= BG_LOW, _PENALTY_LOW, r)
    return jnp.where(nbg >= BG_HIGH, 0.0, r)


def terminated(obs, action, next_obs) -> jax.Array:
    """Whether the step's mean true glucose, estimated from the two readings, left [40, 600).

    NeoRL-2's env ends an episode on the mean of the true glucose over the step's three minutes
    (envNeoRL.py `done`), which no row holds: the reading is the CGM's zero-order hold averaged over the
    step, two thirds of it the previous sample. For glucose moving at a steady rate s per step the mean
    is next + s/3 with s = next - obs, and that estimate is thresholded. NeoRL-2's own rule for models,
    next reading < 40 or > 600 (terminated/simglucose_terminated.py), lags the true glucose and misses
    terminations in the released files. `>= 600` because readings are clipped at 600.
    """
    del action
    bg = jnp.asarray(obs)[..., 0]
    nbg = jnp.asarray(next_obs)[..., 0]
    est = nbg + (nbg - bg) / 3.0
    return (est < BG_LOW) | (est >= BG_HIGH)


def _reward_np(cgm: float, next_cgm: float) -> float:
    # The numpy twin of `reward` in float64, as NeoRL-2's env scores its float64 readings.
    if next_cgm <= BG_LOW:
        return _PENALTY_LOW
    if next_cgm >= BG_HIGH:
        return 0.0
    return float((_risk(cgm, np) - _risk(next_cgm, np) + 100.0) / 100.0)


# -- the UVA/Padova model ------------------------------------------------------------------------------------

class _Patient:
    """One patient's constants and the right-hand side of the 13-state model (NeoRL2 t1dpatient.py `model`).

    State: 0-1 solid and liquid glucose in the stomach, 2 in the gut, 3 plasma and 4 tissue glucose,
    5 plasma insulin, 6 insulin action on utilisation, 7-8 delayed insulin for production, 9 liver insulin,
    10-11 subcutaneous insulin, 12 subcutaneous glucose (mg/kg; divided by Vg it is the glucose in mg/dL).
    """

    def __init__(self, name: str):
        p = patient_params(name)
        self.name = name
        self.params = p
        self.x0 = np.array([p[f"x0_{i}"] for i in range(1, 14)])
        self.properties = np.array([p[k] for k in PATIENT_PROPERTY_NAMES])
        for k in ("BW", "kmax", "kmin", "b", "d", "kabs", "f", "kp1", "kp2", "kp3", "Fsnc", "ke1", "ke2",
                  "k1", "k2", "Vm0", "Vmx", "Km0", "m1", "m2", "m4", "m30", "ka1", "ka2", "Vi", "p2u", "Ib",
                  "ki", "kd", "ksc", "Vg"):
            setattr(self, k, p[k])

    def rhs(self, t, x, cho, insulin, dbar):
        """dx/dt with `cho` g/min eaten, `insulin` pmol/kg/min infused, `dbar` mg the meal being digested."""
        del t
        x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12 = x.tolist()
        kmax, kmin = self.kmax, self.kmin
        qsto = x0 + x1
        # Gastric emptying slows as the stomach empties, between kmax and kmin (tanh switches at b, d).
        if dbar > 0:
            aa = 5.0 / 2.0 / (1.0 - self.b) / dbar
            cc = 5.0 / 2.0 / self.d / dbar
            kgut = kmin + (kmax - kmin) / 2.0 * (
                math.tanh(aa * (qsto - self.b * dbar)) - math.tanh(cc * (qsto - self.d * dbar)) + 2.0)
        else:
            kgut = kmax
        ra = self.f * self.kabs * x2 / self.BW  # rate of appearance of glucose in plasma
        egp = max(self.kp1 - self.kp2 * x3 - self.kp3 * x8, 0.0)  # endogenous production
        renal = self.ke1 * (x3 - self.ke2) if x3 > self.ke2 else 0.0
        uid = (self.Vm0 + self.Vmx * x6) * x4 / (self.Km0 + x4)  # insulin-dependent utilisation
        plasma_insulin = x5 / self.Vi
        dx = np.array([
            -kmax * x0 + cho * 1000.0,
            kmax * x0 - kgut * x1,
            kgut * x1 - self.kabs * x2,
            egp + ra - self.Fsnc - renal - self.k1 * x3 + self.k2 * x4,
            -uid + self.k1 * x3 - self.k2 * x4,
            -(self.m2 + self.m4) * x5 + self.m1 * x9 + self.ka1 * x10 + self.ka2 * x11,
            -self.p2u * x6 + self.p2u * (plasma_insulin - self.Ib),
            -self.ki * (x7 - plasma_insulin),
            -self.ki * (x8 - x7),
            -(self.m1 + self.m30) * x9 + self.m2 * x5,
            insulin - (self.ka1 + self.kd) * x10,
            self.kd * x10 - self.ka2 * x11,
            -self.ksc * x12 + self.ksc * x3,
        ])
        # NeoRL-2 freezes these compartments once they go negative.
        dx[_NONNEGATIVE] *= x[_NONNEGATIVE] >= 0
        return dx


_NONNEGATIVE = np.array([3, 4, 5, 9, 10, 11, 12])


def _meal_at(minute_of_day: int) -> float:
    for t, grams in MEALS:
        if minute_of_day == t:
            return grams
    return 0.0


def _pump_basal(rate: float) -> float:
    # NeoRL2 .../actuator/pump.py basal: rounded to inc_basal pmol/min, then clipped to [min, max] U/min.
    pump = _pump()
    pmol = np.round(rate * U_TO_PMOL / pump["inc_basal"]) * pump["inc_basal"]
    return float(min(max(pmol / U_TO_PMOL, pump["min_basal"]), pump["max_basal"]))


class SimglucoseEnv(gym.Env):
    """NeoRL-2's Simglucose task.

    Observation (float32, 31): the CGM reading (mg/dL) averaged over the last step, then the patient's 30
    constants (`PATIENT_PROPERTY_NAMES`), fixed within an episode.
    Action: one value in [-1, 1] (clipped), mapped affinely to a basal insulin rate in [0, 5] U/min that the
    pump quantises; a step holds it for 3 simulated minutes. No bolus.
    Reward: `reward` on the two readings. Terminates when the step's mean true glucose leaves [40, 600];
    `make_env` truncates at 480 steps (24 hours).

    Each reset draws a start hour in 0..23 and a patient of the mode, both uniform. The day's meals come at
    fixed clock times, so the start hour decides when they fall in the episode. NeoRL-2 draws from numpy's
    global generator; `reset(seed=s)` draws from `numpy.random.RandomState(s)` in NeoRL-2's order, so it
    gives the episode NeoRL-2 gives after `numpy.random.seed(s)`: the released files' episode i was
    collected so, with s = i. `reset()` without a seed continues this env's stream.
    `options={"patient": name, "start_hour": h}` overrides either draw.

    mode: "train" (patients #001-#005 of each group, NeoRL-2's default, in which its datasets were collected
    and its policies scored) or "test" (patients #006-#010, held out); nothing else differs.
    """

    metadata = {"render_modes": []}

    def __init__(self, mode: str = "train"):
        if mode not in PATIENTS:
            raise ValueError(f"mode must be 'train' or 'test', got {mode!r}")
        self.mode = mode
        self.patient_names = PATIENTS[mode]
        self.observation_space = gym.spaces.Box(np.array(OBS_LOW, np.float32), np.array(OBS_HIGH, np.float32),
                                                dtype=np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self._rs: np.random.RandomState | None = None
        self._patient: _Patient | None = None
        self._solver = None

    # -- simulation ------------------------------------------------------------------------------------------
    def _sense(self) -> float:
        # NeoRL2 .../sensor/cgm.py measure: the glucose, noise-free, clipped to the sensor's range.
        s = _sensor()
        return min(max(self._x[12] / self._patient.Vg, s["min"]), s["max"])

    def _minute(self, insulin: float) -> None:
        """Advance one minute: the meal bookkeeping of NeoRL2 t1dpatient.py `step`, then the ODE."""
        self._planned += _meal_at((self._start_minute + self._t) % 1440)
        eat = min(EAT_RATE, self._planned) if self._planned > 0 else 0.0
        self._planned = max(0.0, self._planned - eat)
        if eat > 0 and self._last_eat <= 0:  # a meal starts: remember what the stomach held
            self._meal_base = self._x[0] + self._x[1]
            self._eaten = 0.0
            self._eating = True
        if self._eating:
            self._eaten += eat
        if eat <= 0 and self._last_eat > 0:
            self._eating = False
        self._last_eat = eat
        solver = self._solver
        solver.set_f_params(eat, insulin * U_TO_PMOL / self._patient.BW, self._meal_base + self._eaten * 1000.0)
        solver.integrate(solver.t + 1.0)
        if not solver.successful():
            raise RuntimeError(f"the glucose ODE failed for {self._patient.name} at minute {self._t + 1}")
        self._x = solver.y
        self._t += 1

    def _observe(self) -> np.ndarray:
        return np.concatenate([[self._cgm], self._patient.properties]).astype(np.float32)

    # -- gymnasium API ---------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self._rs = np.random.RandomState(seed)
        elif self._rs is None:
            self._rs = np.random.RandomState(int(self.np_random.integers(2**32)))
        # NeoRL2 neorl2/envs/simglucose.py _create_env draws, in this order: a seed for the sensor and the
        # meal scenario (both deterministic now, so unused), the start hour, the patient.
        self._rs.randint(0, 1000)
        hour = int(self._rs.randint(0, 24))
        name = str(self._rs.choice(self.patient_names))
        options = options or {}
        name = options.get("patient", name)
        hour = int(options.get("start_hour", hour))
        if name not in PATIENTS["train"] + PATIENTS["test"] or not 0 <= hour < 24:
            raise ValueError(f"unknown patient {name!r} or start hour {hour} (0..23)")
        self._patient = _Patient(name)
        self._start_minute = 60 * hour
        self._t = 0
        self._x = self._patient.x0.copy()
        # NeoRL2 t1dpatient.py reset: dopri5 at scipy's default tolerances, from t = 0.
        self._solver = ode(self._patient.rhs).set_integrator("dopri5")
        self._solver.set_initial_value(self._x, 0.0)
        self._planned = 0.0
        self._last_eat = 0.0
        self._eating = False
        self._meal_base = self._x[0] + self._x[1]
        self._eaten = 0.0
        self._sample = self._sense()  # the sensor's held sample
        self._cgm = self._sample  # the first observation is the sample itself
        info = {"patient": name, "start_hour": hour, "bg": self._x[12] / self._patient.Vg}
        return self._observe(), info

    def step(self, action):
        action = np.asarray(action, dtype=np.float32).reshape(1)
        if not np.all(np.isfinite(action)):  # a NaN rate would only surface as a failure of the ODE solver
            raise ValueError(f"Simglucose: the action must be finite, found {action.tolist()} (a diverged policy?)")
        action = np.clip(action, -1.0, 1.0)
        # NeoRL2 neorl2/envs/simglucose.py step: (a + 1) / 2 * 5 in the action's float32.
        rate = float(((action + np.float32(1.0)) / np.float32(2.0) * np.float32(MAX_INSULIN))[0])
        insulin = _pump_basal(rate)
        cgm = bg = meal = 0.0
        sample_every = int(_sensor()["sample_time"])
        # NeoRL2 .../simulation/envNeoRL.py step: three one-minute steps; the reading and the glucose are
        # their means. The sensor takes a new sample on whole multiples of 3 minutes and holds it between.
        for _ in range(STEP_MINUTES):
            self._minute(insulin)
            meal += self._last_eat / STEP_MINUTES
            if self._t % sample_every == 0:
                self._sample = self._sense()
            cgm += self._sample / STEP_MINUTES
            bg += self._x[12] / self._patient.Vg / STEP_MINUTES
        r = _reward_np(self._cgm, cgm)
        self._cgm = cgm
        term = bool(bg < BG_LOW or bg > BG_HIGH)
        info = {"bg": bg, "insulin": insulin, "meal": meal, "minute_of_day": (self._start_minute + self._t) % 1440}
        return self._observe(), r, term, False, info


def make_env(mode: str = "train", **kwargs) -> gym.Env:
    """Simglucose in `mode` ("train" or "test"), truncated at 480 steps."""
    max_steps = kwargs.pop("max_episode_steps", EPISODE_STEPS)
    return gym.wrappers.TimeLimit(SimglucoseEnv(mode=mode, **kwargs), max_episode_steps=max_steps)
