"""Robot embodiments: one module per robot, holding the layout of its action vector.

Policies build actions and backends read them through these names, so an
index is defined once. ``panda_omron`` is RoboCasa's mobile manipulator (the
12-D action every backend takes today).
"""
