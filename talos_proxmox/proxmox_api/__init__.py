"""The Proxmox VE API as day two needs it (the VM's pending changes, its power state, a start that applies
them, its task), through proxmoxer, with the credentials the Proxmox provider itself reads. No Pulumi here."""
