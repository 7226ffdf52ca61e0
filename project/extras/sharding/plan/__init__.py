"""The sharding layer's part of the plan: its config subsections, table rows, degrees, notes and ``plan`` report.

Pure, as :mod:`project.plan` is: nothing here starts a process or touches a GPU.
"""
