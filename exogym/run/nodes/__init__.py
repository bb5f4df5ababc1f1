"""(map written below)"""
