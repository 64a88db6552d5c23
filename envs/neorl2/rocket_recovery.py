"""NeoRL-2's RocketRecovery: land a rocket (Gymnasium's continuous LunarLander body) on a flat pad in wind.

Written from NeoRL-2's definitions (polixir/NeoRL2, `neorl2/envs/rocketrecovery.py`, reward in
`neorl2/envs/reward/rocketrecovery_reward.py`, termination in
`neorl2/envs/terminated/rocketrecovery_terminated.py`).
The physics is Box2D's, as in NeoRL-2: the `Box2D` package (PyPI `box2d`, Gymnasium's `box2d` extra) is
imported only when the env is built, so the reward and termination functions need nothing but jax.

The episode ends as soon as the lander's height above its touchdown height is within 0.05 (in the
observation's units): a landing is scored +100 if it is upright and slow, -100 otherwise. Between, the
reward is the step's gain in a shaping potential (distance to the pad, speed, tilt) less the engines' fuel.
"""

from __future__ import annotations

import math

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

# NeoRL2 neorl2/envs/rocketrecovery.py step: the state list (leg contacts dropped, wind force appended).
OBS_NAMES = ("x", "y", "vx", "vy", "angle", "angular_velocity", "wind")
# Continuous LunarLander actions: main engine (off below 0, 50..100 % over 0..1), side engines
# (left below -0.5, right above 0.5, 50..100 % over 0.5..1 in magnitude, off between).
ACT_NAMES = ("main_engine", "side_engine")
# NeoRL2 neorl2/envs/rocketrecovery.py: FPS = 50, one Box2D step of 1/FPS s per env step.
CONTROL_HZ = 50.0
# NeoRL2 neorl2/envs/rocketrecovery.py: the observation space's bounds (position 1.5, velocities and
# angular velocity 5, angle pi); the wind force is unbounded there (in fact |wind| <= wind_power * tanh 2).
OBS_LOW = (-1.5, -1.5, -5.0, -5.0, -math.pi, -5.0, -math.inf)
OBS_HIGH = (1.5, 1.5, 5.0, 5.0, math.pi, 5.0, math.inf)
# NeoRL2 neorl2/__init__.py: RocketRecovery registered with max_episode_steps=500.
EPISODE_STEPS = 500

# NeoRL2 neorl2/envs/rocketrecovery.py: module constants (Box2D units are pixels / SCALE).
FPS = 50
SCALE = 30.0
MAIN_ENGINE_POWER = 13.0
SIDE_ENGINE_POWER = 0.6
INITIAL_RANDOM = 500.0  # the initial push: each force component ~ U(-500, 500), over the first step
LANDER_POLY = ((-14, 17), (-17, 0), (-17, -10), (17, -10), (17, 0), (14, 17))
LEG_AWAY, LEG_DOWN, LEG_W, LEG_H = 20, 18, 2, 8
LEG_SPRING_TORQUE = 40
SIDE_ENGINE_HEIGHT = 14
SIDE_ENGINE_AWAY = 12
MAIN_ENGINE_Y_LOCATION = 4
VIEWPORT_W, VIEWPORT_H = 600, 400
W, H = VIEWPORT_W / SCALE, VIEWPORT_H / SCALE
HELIPAD_Y = H / 4  # the whole terrain is flat at the pad's height (NeoRL-2 smooths every chunk to it)
TERRAIN_CHUNKS = 11
GRAVITY = -10.0
# NeoRL2 neorl2/envs/rocketrecovery.py __init__: wind on (power 10), no turbulence; mode "test" scales
# the wind power by 1.2.
WIND_POWER = {"train": 10.0, "test": 12.0}
# NeoRL2 rocketrecovery.py __init__: wind_idx ~ randint(-9999, 9999) from numpy's global stream.
WIND_INDEX_RANGE = (-9999, 9999)
_LEG_REST_OVERSHOOT = 0.002  # rad past the joint limit where a leg rests in flight (see set_state_from_obs)

# NeoRL2 neorl2/envs/reward/rocketrecovery_reward.py: the shaping weights, fuel costs, landing rule.
_SHAPING_WEIGHT = 100.0
_MAIN_FUEL, _SIDE_FUEL = 0.3, 0.03
_LAND_HEIGHT = 0.05  # |next y| <= 0.05 ends the episode (also the termination rule)
_SAFE_ANGLE, _SAFE_VX, _SAFE_VY = 0.3, 0.5, 2.0
_LANDING_REWARD = 100.0


def _shaping(xp, s):
    # Term by term in NeoRL-2's order, so that float32 rounding matches the file's.
    return (-_SHAPING_WEIGHT * xp.sqrt(s[..., 0] * s[..., 0] + s[..., 1] * s[..., 1])
            - _SHAPING_WEIGHT * xp.sqrt(s[..., 2] * s[..., 2] + s[..., 3] * s[..., 3])
            - _SHAPING_WEIGHT * xp.abs(s[..., 4]))


def _engine_powers(xp, action):
    main, side = action[..., 0], action[..., 1]
    m_power = xp.where(main > 0.0, (xp.clip(main, 0.0, 1.0) + 1.0) * 0.5, 0.0)
    s_power = xp.where(xp.abs(side) > 0.5, xp.clip(xp.abs(side), 0.5, 1.0), 0.0)
    return m_power, s_power


def _reward(xp, obs, action, next_obs):
    m_power, s_power = _engine_powers(xp, action)
    flight = _shaping(xp, next_obs) - _shaping(xp, obs)
    flight = flight - m_power * _MAIN_FUEL
    flight = flight - s_power * _SIDE_FUEL
    safe = ((xp.abs(next_obs[..., 4]) < _SAFE_ANGLE) & (xp.abs(next_obs[..., 2]) < _SAFE_VX)
            & (xp.abs(next_obs[..., 3]) < _SAFE_VY))
    landing = xp.where(safe, _LANDING_REWARD, -_LANDING_REWARD)
    return xp.where(xp.abs(next_obs[..., 1]) <= _LAND_HEIGHT, landing, flight)


def reward(obs, action, next_obs) -> jax.Array:
    """Shaping gain less fuel in flight; +100 for an upright slow landing, -100 for any other.

    NeoRL2 neorl2/envs/reward/rocketrecovery_reward.py: shaping(s) = -100 (|(x, y)| + |(vx, vy)| + |angle|),
    fuel 0.3 m_power + 0.03 s_power from the raw action, and on a landing row (|next y| <= 0.05) the reward
    is replaced by +100 if |angle| < 0.3, |vx| < 0.5 and |vy| < 2 on next_obs, else -100.
    """
    return _reward(jnp, jnp.asarray(obs), jnp.asarray(action), jnp.asarray(next_obs))


def terminated(obs, action, next_obs) -> jax.Array:
    """The lander has come down: |next y| <= 0.05 (NeoRL2 neorl2/envs/terminated/rocketrecovery_terminated.py)."""
    del obs, action
    return jnp.abs(jnp.asarray(next_obs)[..., 1]) <= _LAND_HEIGHT


def _wind(index, power: float):
    # NeoRL2 rocketrecovery.py step: wind force tanh(sin(0.02 i) + sin(0.01 pi i)) * wind_power, i += 1 a step.
    return np.tanh(np.sin(0.02 * index) + np.sin(math.pi * 0.01 * index)) * power


class RocketRecoveryEnv(gym.Env):
    """NeoRL-2's RocketRecovery task (Box2D physics).

    Observation (float32): x, y of the lander relative to its touchdown point on the pad (in half-viewport
    units), vx, vy (scaled as LunarLander scales them), angle (rad), angular velocity (x 0.4), and the wind
    force applied in the last step. Action: main and side engine throttles in [-1, 1] (clipped).
    Reward and termination: `reward` and `terminated` on (obs, action, next_obs); `make_env` truncates at
    500 steps.

    Randomness, drawn in NeoRL-2's order from the env's `np_random`, so that `reset(seed=s)` starts as
    NeoRL-2's `reset(seed=s)` does: twelve terrain heights (unused: the terrain is flat), the initial push,
    then each step two engine "dispersions" of up to 1/SCALE, which move where the engines' impulses act
    and scale the main engine's impulse by 0.5..1.5. The wind's phase (its index) is, in NeoRL-2, an
    unseeded draw from numpy's global stream in [-9999, 9999) when the env is built, carried on across
    its episodes (the released file's episodes each start at their own phase). Here it is drawn from
    `numpy.random.default_rng(seed)` at the first reset and at any reset given a seed, carried on
    otherwise, or set with `reset(options={"wind_index": i})`: with NeoRL-2's seed and wind index, an
    episode replays NeoRL-2's.

    mode: "train" (wind power 10, NeoRL-2's default, in which its datasets were collected) or "test"
    (wind power 12, NeoRL-2's held-out variant); nothing else differs.
    """

    metadata = {"render_modes": [], "render_fps": FPS}

    def __init__(self, mode: str = "train"):
        if mode not in WIND_POWER:
            raise ValueError(f"mode must be 'train' or 'test', got {mode!r}")
        # lazy: mbrl.envs.tasks imports this module for its jax reward and termination; only the env needs Box2D
        import Box2D  # noqa: F401  (fails here, not mid-episode, where the box2d package is missing)

        self.mode = mode
        self.wind_power = WIND_POWER[mode]
        self.observation_space = gym.spaces.Box(np.array(OBS_LOW, np.float32), np.array(OBS_HIGH, np.float32))
        self.action_space = gym.spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)
        self._world = Box2D.b2World(gravity=(0.0, GRAVITY))
        self._ground = self._lander = None
        self._legs: list = []
        self._wind_index: int | None = None
        self._obs = np.zeros(7, np.float32)

    # -- bodies -------------------------------------------------------------------------------------------
    def _destroy(self) -> None:
        for body in [self._ground, self._lander, *self._legs]:
            if body is not None:
                self._world.DestroyBody(body)
        self._ground = self._lander = None
        self._legs = []

    def _build(self, push: tuple[float, float]) -> None:
        from Box2D.b2 import edgeShape, fixtureDef, polygonShape, revoluteJointDef  # lazy: as in __init__

        self._destroy()
        # NeoRL2 rocketrecovery.py reset: an edge along y = 0 and the terrain, flat at the pad's height.
        self._ground = self._world.CreateStaticBody(shapes=edgeShape(vertices=[(0, 0), (W, 0)]))
        self._ground.CreateEdgeFixture(vertices=[(0, HELIPAD_Y), (W, HELIPAD_Y)], density=0, friction=0.1)
        x0, y0 = W / 2, H
        self._lander = self._world.CreateDynamicBody(
            position=(x0, y0), angle=0.0,
            fixtures=fixtureDef(shape=polygonShape(vertices=[(x / SCALE, y / SCALE) for x, y in LANDER_POLY]),
                                density=5.0, friction=0.1, categoryBits=0x0010, maskBits=0x001, restitution=0.0))
        self._lander.ApplyForceToCenter(push, True)
        for side in (-1, 1):
            leg = self._world.CreateDynamicBody(
                position=(x0 - side * LEG_AWAY / SCALE, y0), angle=side * 0.05,
                fixtures=fixtureDef(shape=polygonShape(box=(LEG_W / SCALE, LEG_H / SCALE)), density=1.0,
                                    restitution=0.0, categoryBits=0x0020, maskBits=0x001))
            # A motor holds each leg against the inner end of its 0.5 rad joint range (|joint angle| 0.4).
            low = 0.4 if side == -1 else -0.9
            self._world.CreateJoint(revoluteJointDef(
                bodyA=self._lander, bodyB=leg, localAnchorA=(0, 0),
                localAnchorB=(side * LEG_AWAY / SCALE, LEG_DOWN / SCALE), enableMotor=True, enableLimit=True,
                maxMotorTorque=LEG_SPRING_TORQUE, motorSpeed=0.3 * side, lowerAngle=low, upperAngle=low + 0.5))
            self._legs.append(leg)

    def _observe(self, wind: float) -> np.ndarray:
        pos, vel = self._lander.position, self._lander.linearVelocity
        return np.array([
            (pos.x - W / 2) / (W / 2),
            (pos.y - (HELIPAD_Y + LEG_DOWN / SCALE)) / (H / 2),
            vel.x * (W / 2) / FPS,
            vel.y * (H / 2) / FPS,
            self._lander.angle,
            20.0 * self._lander.angularVelocity / FPS,
            wind,
        ], dtype=np.float32)

    def _advance(self, action: np.ndarray) -> np.ndarray:
        """One NeoRL-2 step: wind, engine impulses with dispersion, one Box2D step; returns the observation.

        Same operations in the same order as NeoRL-2, in Python floats (NeoRL-2's numpy-1 scalars were
        float64), so that a seeded episode replays NeoRL-2's up to Box2D's own float rounding.
        """
        lander = self._lander
        i = self._wind_index
        wind = math.tanh(math.sin(0.02 * i) + math.sin(math.pi * 0.01 * i)) * self.wind_power
        self._wind_index += 1
        lander.ApplyForceToCenter((wind, 0.0), True)
        tip = (math.sin(lander.angle), math.cos(lander.angle))
        side = (-tip[1], tip[0])
        # Drawn every step, engines on or not, as NeoRL-2 does (keeps the seeded stream aligned).
        disp = [self.np_random.uniform(-1.0, 1.0) / SCALE for _ in range(2)]
        main, lateral = float(action[0]), float(action[1])
        if main > 0.0:
            m_power = (min(main, 1.0) + 1.0) * 0.5
            arm = MAIN_ENGINE_Y_LOCATION / SCALE + 2 * disp[0]
            ox, oy = tip[0] * arm + side[0] * disp[1], -tip[1] * arm - side[1] * disp[1]
            at = (lander.position[0] + ox, lander.position[1] + oy)
            impulse = (-ox * MAIN_ENGINE_POWER * m_power, -oy * MAIN_ENGINE_POWER * m_power)
            lander.ApplyLinearImpulse(impulse, at, True)
        if abs(lateral) > 0.5:
            s_power = min(abs(lateral), 1.0)
            arm = 3 * disp[1] + math.copysign(SIDE_ENGINE_AWAY, lateral) / SCALE
            ox, oy = tip[0] * disp[0] + side[0] * arm, -tip[1] * disp[0] - side[1] * arm
            # NeoRL-2 (as LunarLander) offsets the side thrust by 17 px across and 14 px along the body.
            at = (lander.position[0] + ox - tip[0] * 17 / SCALE,
                  lander.position[1] + oy + tip[1] * SIDE_ENGINE_HEIGHT / SCALE)
            impulse = (-ox * SIDE_ENGINE_POWER * s_power, -oy * SIDE_ENGINE_POWER * s_power)
            lander.ApplyLinearImpulse(impulse, at, True)
        self._world.Step(1.0 / FPS, 6 * 30, 2 * 30)
        return self._observe(wind)

    # -- gymnasium API ------------------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        if "wind_index" in options:
            self._wind_index = int(options["wind_index"])
        elif seed is not None or self._wind_index is None:
            rng = np.random.default_rng(seed if seed is not None else int(self.np_random.integers(2**32)))
            self._wind_index = int(rng.integers(*WIND_INDEX_RANGE))
        self.np_random.uniform(0, H / 2, size=(TERRAIN_CHUNKS + 1,))  # NeoRL-2's terrain draw, kept for seeding
        push = (float(self.np_random.uniform(-INITIAL_RANDOM, INITIAL_RANDOM)),
                float(self.np_random.uniform(-INITIAL_RANDOM, INITIAL_RANDOM)))
        self._build(push)
        # NeoRL2 rocketrecovery.py reset: the first observation is that of one step with the engines off.
        self._obs = self._advance(np.zeros(2, np.float32))
        return self._obs.copy(), {}

    def step(self, action):
        if self._lander is None:
            raise RuntimeError("call reset() before step()")
        action = np.clip(np.asarray(action, dtype=np.float32).reshape(2), -1.0, 1.0)
        obs = self._obs
        next_obs = self._advance(action)
        r = float(_reward(np, obs, action, next_obs))
        term = bool(abs(next_obs[1]) <= _LAND_HEIGHT)
        self._obs = next_obs
        return next_obs.copy(), r, term, False, {}

    def set_state_from_obs(self, obs, wind_index: int | None = None) -> None:
        """Put the lander in the state a dataset row's `obs` shows, its legs rigidly at rest.

        The observation holds neither the legs' state (they swing for about the first 25 steps, then rest
        against their joint limits, where this puts them) nor the wind's phase. `wind_index` is the index
        of the wind the next step applies; by default, one past the index in NeoRL-2's range whose wind is
        nearest the one `obs` shows (several phases give the same force, rising or falling, so the next
        force may be off by about the wind's change over one step).
        """
        if self._lander is None:
            self.reset()
        obs = np.asarray(obs, dtype=np.float64).reshape(7)
        if wind_index is None:
            grid = np.arange(WIND_INDEX_RANGE[0], WIND_INDEX_RANGE[1] + EPISODE_STEPS)
            wind_index = int(grid[np.argmin(np.abs(_wind(grid, self.wind_power) - obs[6]))]) + 1
        self._wind_index = int(wind_index)
        # The inverse of `_observe`.
        x, y = obs[0] * W / 2 + W / 2, obs[1] * H / 2 + HELIPAD_Y + LEG_DOWN / SCALE
        vx, vy = obs[2] * FPS / (W / 2), obs[3] * FPS / (H / 2)
        angle, omega = obs[4], obs[5] * FPS / 20.0
        for body in (self._lander, *self._legs):
            body.angularVelocity = omega
            body.awake = True
        self._lander.position, self._lander.angle, self._lander.linearVelocity = (x, y), angle, (vx, vy)
        for leg in self._legs:
            joint = leg.joints[0].joint
            # At rest the motor holds the leg a little past the limit it drives toward (Box2D lets a limit
            # sink by up to its slop; they settle 0.001-0.004 rad past). Placing it exactly at the limit
            # would leave the limit inactive for a step and let the motor kick the leg. The joint angle is
            # measured from the pose the leg was built in (its reference angle, the build tilt of 0.05 rad).
            if joint.motorSpeed < 0:
                limit = joint.lowerLimit - _LEG_REST_OVERSHOOT
            else:
                limit = joint.upperLimit + _LEG_REST_OVERSHOOT
            leg_angle = angle + joint.GetReferenceAngle() + limit
            ax, ay = joint.GetLocalAnchorB()  # on the lander's centre (its local anchor A is the origin)
            c, s = math.cos(leg_angle), math.sin(leg_angle)
            rx, ry = -(c * ax - s * ay), -(s * ax + c * ay)  # leg centre relative to the lander's centre
            leg.position, leg.angle = (x + rx, y + ry), leg_angle
            leg.linearVelocity = (vx - omega * ry, vy + omega * rx)
        self._obs = obs.astype(np.float32)


def make_env(mode: str = "train", **kwargs) -> gym.Env:
    """RocketRecovery in `mode` ("train" or "test"), truncated at 500 steps."""
    max_steps = kwargs.pop("max_episode_steps", EPISODE_STEPS)
    return gym.wrappers.TimeLimit(RocketRecoveryEnv(mode=mode, **kwargs), max_episode_steps=max_steps)
