"""What the doctor --fix tests of the thunderbolt-ipv4 fix share with its lab test
(tests/lab/test_fix_macos_lab.py): the real captures its two Macs are built from, and the
IP plan the fix sets on each with ``sudo -n`` and takes back by its undo.

mbp: the glpi MacBook Pro's ifconfig -a (en1, its cable's port, a bridge0 member without
inet; bridge0 UP). studio: Apple TN3205's `ifconfig en2`, self-assigned 169.254.205.255/16,
as en3 (where the studio's cable is). Their ssh addresses are those of
``inventory_text(["mbp", "studio"])`` (tests/inventory_support.py).
"""

from __future__ import annotations

GLPI_IFCONFIG = "ifconfig_a_glpi_mbp16_apple_silicon_2021_macos14.4_bridge0_en1_en2_en3.txt"
TN3205_IFCONFIG = "ifconfig_en2_apple_tn3205_thunderbolt_ip_linklocal.txt"
MBP, STUDIO = "10.9.0.1", "10.9.0.2"

MBP_COMMANDS = ["sudo -n ifconfig bridge0 down",
                "sudo -n ifconfig en1 inet 192.168.0.1 netmask 255.255.255.252",
                "sudo -n route change 192.168.0.2 -interface en1"]
MBP_UNDO = ["sudo -n ifconfig en1 inet 192.168.0.1 -alias", "sudo -n ifconfig bridge0 up"]
STUDIO_COMMANDS = ["sudo -n ifconfig en3 inet 192.168.0.2 netmask 255.255.255.252",
                   "sudo -n route change 192.168.0.1 -interface en3"]
STUDIO_UNDO = ["sudo -n ifconfig en3 inet 192.168.0.2 -alias",
               "sudo -n ifconfig en3 inet 169.254.205.255 netmask 255.255.0.0 alias"]
